//! `opentelemetry`: traces of the requests a route serves, by OTLP to a collector.
//!
//! W3C `traceparent`/`tracestate` are read from the client (a new trace when none came) and
//! written into every upstream attempt (each with its own span id). A sampled request becomes
//! a server span with the HTTP semantic-convention attributes, a client span per upstream
//! attempt (retries included) and, with `plugin_spans: true`, one span per plugin phase. The
//! host measures attempts and phases only for sampled requests (`weir_plugin::measure`); the
//! spans are made and sent on an exporter thread, in batches, from a bounded queue
//! ([`export`]).
//!
//! Route configuration follows APISIX (`sampler`, `additional_attributes`,
//! `additional_header_prefix_attributes`); the collector, resource and batch settings are in
//! `plugin_attr.opentelemetry` as APISIX names them, plus `collector.protocol: http | grpc`.

pub mod export;
mod otlp;
mod sampler;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::measure::{self, Measured, TraceContext};
use weir_plugin::{
    parse_conf, register_plugin, schema_of, BuildContext, Flow, InitEnv, Late, Plugin, PluginInstance, RequestCtx,
    Value,
};

pub use sampler::{Sampler, SamplerConf};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Which requests are traced (APISIX's default: `always_off`).
    #[serde(default)]
    pub sampler: SamplerConf,
    /// Variables (`$http_user_agent`, `$arg_id`, `$route_id`...) added to the server span as
    /// attributes named after them.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub additional_attributes: Vec<String>,
    /// Request headers whose name starts with one of these are added to the server span
    /// (attribute: the header's name).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub additional_header_prefix_attributes: Vec<String>,
    /// A span per plugin phase (`<plugin> <phase>`), children of the server span.
    #[serde(default)]
    pub plugin_spans: bool,
}

/// `plugin_attr.opentelemetry`.
#[derive(Debug, Clone, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Attr {
    /// `random` (APISIX's default); `x-request-id` is accepted and ignored, with a warning.
    #[serde(default)]
    pub trace_id_source: Option<String>,
    /// Resource attributes; `service.name` defaults to `weir`.
    #[serde(default)]
    pub resource: BTreeMap<String, Value>,
    /// Where spans go.
    #[serde(default)]
    pub collector: Collector,
    /// Batching.
    #[serde(default)]
    pub batch_span_processor: BatchSpanProcessor,
    /// APISIX's nginx variables: accepted and ignored, with a warning.
    #[serde(default)]
    pub set_ngx_var: Option<bool>,
}

/// `plugin_attr.opentelemetry.collector`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Collector {
    /// `host:port` of the collector (`http://` may precede it). OTLP/HTTP posts to
    /// `/v1/traces`.
    #[serde(default = "default_address")]
    #[schemars(length(min = 1, max = 512))]
    pub address: String,
    /// Seconds an export may take (connect included).
    #[serde(default = "default_request_timeout")]
    #[schemars(range(min = 0.001, max = 600.0))]
    pub request_timeout: f64,
    /// Headers (gRPC metadata) sent with each export.
    #[serde(default)]
    pub request_headers: BTreeMap<String, String>,
    /// `http` (OTLP/HTTP, protobuf) or `grpc` (OTLP/gRPC).
    #[serde(default)]
    pub protocol: ProtocolName,
}

impl Default for Collector {
    fn default() -> Self {
        Collector {
            address: default_address(),
            request_timeout: default_request_timeout(),
            request_headers: BTreeMap::new(),
            protocol: ProtocolName::Http,
        }
    }
}

/// `collector.protocol`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ProtocolName {
    /// OTLP/HTTP with protobuf bodies.
    #[default]
    Http,
    /// OTLP/gRPC.
    Grpc,
}

/// `plugin_attr.opentelemetry.batch_span_processor`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSpanProcessor {
    /// Weir never blocks a request on the queue: `false` is accepted and ignored, with a warning.
    #[serde(default)]
    pub drop_on_queue_full: Option<bool>,
    /// Spans waiting for export at most; beyond, a request's spans are dropped (counted).
    #[serde(default = "default_max_queue_size")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_queue_size: usize,
    /// Seconds a batch waits at most before it is sent.
    #[serde(default = "default_batch_timeout")]
    #[schemars(range(min = 0.001, max = 600.0))]
    pub batch_timeout: f64,
    /// Seconds without a new span after which the batch is sent.
    #[serde(default = "default_inactive_timeout")]
    #[schemars(range(min = 0.001, max = 600.0))]
    pub inactive_timeout: f64,
    /// Spans per export at most.
    #[serde(default = "default_max_export_batch_size")]
    #[schemars(range(min = 1, max = 100_000))]
    pub max_export_batch_size: usize,
}

impl Default for BatchSpanProcessor {
    fn default() -> Self {
        BatchSpanProcessor {
            drop_on_queue_full: None,
            max_queue_size: default_max_queue_size(),
            batch_timeout: default_batch_timeout(),
            inactive_timeout: default_inactive_timeout(),
            max_export_batch_size: default_max_export_batch_size(),
        }
    }
}

fn default_address() -> String {
    "127.0.0.1:4318".into()
}
fn default_request_timeout() -> f64 {
    3.0
}
fn default_max_queue_size() -> usize {
    2048
}
fn default_batch_timeout() -> f64 {
    2.0
}
fn default_inactive_timeout() -> f64 {
    1.0
}
fn default_max_export_batch_size() -> usize {
    512
}

/// Checks `attr` into the exporter's settings; the warnings are for settings Weir ignores.
pub fn settings(attr: &Attr) -> Result<(export::Settings, Vec<String>), String> {
    let mut warnings = Vec::new();
    let c = &attr.collector;
    let address = c.address.strip_prefix("http://").unwrap_or(&c.address).trim_end_matches('/').to_owned();
    if c.address.starts_with("https://") {
        return Err("collector.address: `https://` is not supported; use a local collector (`host:port`)".into());
    }
    export::check_address(&address).map_err(|e| format!("collector.address: {e}"))?;
    let mut request_headers = Vec::new();
    for (k, v) in &c.request_headers {
        let name = http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("collector.request_headers: `{k}` is not a header name"))?;
        let value = http::HeaderValue::from_str(v)
            .map_err(|_| format!("collector.request_headers.{k}: not a valid header value"))?;
        request_headers.push((name, value));
    }
    let mut resource = Vec::new();
    if !attr.resource.contains_key("service.name") {
        export::resource_attr(&mut resource, "service.name", &Value::from("weir")).ok_or("service.name")?;
    }
    for (k, v) in &attr.resource {
        export::resource_attr(&mut resource, k, v)
            .ok_or_else(|| format!("resource.{k}: must be a string, a number or a boolean"))?;
    }
    let b = &attr.batch_span_processor;
    if b.drop_on_queue_full == Some(false) {
        warnings.push(
            "batch_span_processor.drop_on_queue_full: false is ignored: a request never waits for the span \
             queue; when it is full, spans are dropped and counted (opentelemetry_spans_dropped_total)"
                .to_owned(),
        );
    }
    if b.max_export_batch_size > b.max_queue_size {
        warnings.push(format!(
            "batch_span_processor.max_export_batch_size ({}) is larger than max_queue_size ({}): batches hold at most \
             max_queue_size spans",
            b.max_export_batch_size, b.max_queue_size
        ));
    }
    match attr.trace_id_source.as_deref() {
        None | Some("random") => {}
        Some(other) => warnings.push(format!(
            "trace_id_source: `{other}` is ignored: trace ids come from the client's traceparent or are random"
        )),
    }
    if attr.set_ngx_var.is_some() {
        warnings.push("set_ngx_var is ignored: Weir has no nginx variables".to_owned());
    }
    let secs = |s: f64| Duration::from_secs_f64(s.max(0.001));
    Ok((
        export::Settings {
            protocol: match c.protocol {
                ProtocolName::Http => export::Protocol::Http,
                ProtocolName::Grpc => export::Protocol::Grpc,
            },
            address,
            request_timeout: secs(c.request_timeout),
            request_headers,
            resource,
            max_queue_size: b.max_queue_size,
            batch_timeout: secs(b.batch_timeout),
            inactive_timeout: secs(b.inactive_timeout),
            max_export_batch_size: b.max_export_batch_size,
        },
        warnings,
    ))
}

/// A client's `traceparent` (version 00, or a later version read as 00 allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

fn hex_into(out: &mut [u8], text: &[u8]) -> Option<()> {
    if text.len() != out.len() * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    for (o, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(())
}

/// Parses a `traceparent` value by the W3C Trace Context rules: lowercase hex, version `ff`
/// invalid, all-zero ids invalid, version 00 exactly 55 bytes, later versions may append
/// fields after a dash. An invalid one starts a new trace.
pub fn parse_traceparent(value: &[u8]) -> Option<Parent> {
    let value = value.trim_ascii();
    if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let mut version = [0u8; 1];
    hex_into(&mut version, &value[..2])?;
    if version[0] == 0xff || (version[0] == 0 && value.len() != 55) || (value.len() > 55 && value[55] != b'-') {
        return None;
    }
    let mut p = Parent { trace_id: [0; 16], span_id: [0; 8], sampled: false };
    hex_into(&mut p.trace_id, &value[3..35])?;
    hex_into(&mut p.span_id, &value[36..52])?;
    let mut flags = [0u8; 1];
    hex_into(&mut flags, &value[53..55])?;
    if p.trace_id == [0; 16] || p.span_id == [0; 8] {
        return None;
    }
    p.sampled = flags[0] & 1 == 1;
    Some(p)
}

/// Fuzzing entry point: any bytes as a `traceparent` parse or are refused, never panic, and
/// what parses is written back (as the host sends it upstream) to the same ids and flag.
pub fn fuzz_traceparent(data: &[u8]) {
    let Some(p) = parse_traceparent(data) else { return };
    let t = TraceContext { trace_id: p.trace_id, span_id: p.span_id, parent_id: None, sampled: p.sampled, state: None };
    let again = parse_traceparent(t.traceparent(&p.span_id).as_bytes());
    assert_eq!(again, Some(p), "{}", String::from_utf8_lossy(data));
}

/// The plugin.
pub struct OpenTelemetry;

struct Instance {
    sampler: Sampler,
    plugin_spans: bool,
    attributes: Vec<String>,
    header_prefixes: Vec<String>,
}

/// What a sampled request keeps from its rewrite phase for the log phase (the request headers
/// may be gone by then).
struct Seen {
    host: Option<String>,
    headers: Vec<(String, String)>,
}

thread_local! {
    /// The request whose spans were queued last on this thread: with the plugin on a global
    /// rule and on the route, both instances log the same request.
    static LAST: Cell<(usize, Option<Instant>)> = const { Cell::new((0, None)) };
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        // `additional_attributes` may name request headers (`http_*`).
        Late { headers: !self.attributes.is_empty(), header_filter: false, log: true }
    }

    fn log_last(&self) -> bool {
        true
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        if ctx.measured.as_ref().is_some_and(|m| m.trace.is_some()) {
            // Another instance (a global rule's) decided already.
            return Flow::Continue;
        }
        let parent = ctx.headers.get(measure::TRACEPARENT).and_then(|v| parse_traceparent(v.as_bytes()));
        let trace_id = parent.map_or_else(measure::new_trace_id, |p| p.trace_id);
        let sampled = self.sampler.sample(&trace_id, parent.map(|p| p.sampled));
        let state = parent.and_then(|_| ctx.headers.get(measure::TRACESTATE).cloned());
        if sampled {
            let host = ctx.var("host").map(|h| h.into_owned());
            let mut headers = Vec::new();
            for (name, value) in ctx.headers.iter() {
                if self.header_prefixes.iter().any(|p| name.as_str().starts_with(p.as_str())) {
                    headers.push((name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned()));
                }
            }
            ctx.slots.insert(Seen { host, headers });
        }
        let m = ctx.measured.get_or_insert_with(|| Box::new(Measured::default()));
        m.trace = Some(TraceContext {
            trace_id,
            span_id: measure::new_span_id(),
            parent_id: parent.map(|p| p.span_id),
            sampled,
            state,
        });
        if sampled {
            m.attempts = true;
            m.phases |= self.plugin_spans;
        }
        Flow::Continue
    }

    fn log(&self, ctx: &RequestCtx) {
        let Some(m) = ctx.measured.as_deref() else { return };
        let Some(trace) = m.trace.as_ref().filter(|t| t.sampled) else { return };
        let me = (ctx as *const RequestCtx as usize, Some(ctx.started));
        if LAST.with(|l| l.replace(me)) == me {
            return;
        }
        let seen = ctx.slot::<Seen>();
        let mut extra: Vec<(String, String)> = seen.map(|s| s.headers.clone()).unwrap_or_default();
        for name in &self.attributes {
            if let Some(v) = ctx.var(name) {
                extra.push((name.clone(), v.into_owned()));
            }
        }
        export::push(export::Record {
            trace: trace.clone(),
            start: ctx.started,
            end: Instant::now(),
            method: ctx.method.clone(),
            path: ctx.path.clone(),
            route_pattern: ctx.matched_uri.clone(),
            route_id: ctx.route_id.clone(),
            consumer: ctx.consumer.as_ref().map(|c| c.username.clone()),
            client: ctx.remote_ip.clone(),
            client_port: ctx.remote_addr.port(),
            server_address: seen.and_then(|s| s.host.clone()),
            server_port: ctx.local_addr.port(),
            scheme: ctx.scheme,
            status: ctx.status,
            attempts: m.attempt_list.clone(),
            phases: if self.plugin_spans { m.phase_times.clone() } else { Vec::new() },
            extra,
        });
    }
}

impl Plugin for OpenTelemetry {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "opentelemetry"
    }
    fn priority(&self) -> i32 {
        // APISIX's: before every other plugin, so that their phases fall inside the trace.
        12009
    }
    fn attr_schema(&self) -> Option<Value> {
        Some(schema_of::<Attr>())
    }
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        let attr: Attr = match attr {
            Some(v) => parse_conf(v).map_err(|e| format!("plugin_attr.opentelemetry: {e}"))?,
            None => Attr::default(),
        };
        let (settings, warnings) = settings(&attr).map_err(|e| format!("plugin_attr.opentelemetry.{e}"))?;
        for w in &warnings {
            log::warn!("plugin_attr.opentelemetry.{w}");
        }
        if env.check_only {
            return Ok(());
        }
        export::configure(settings)?;
        weir_plugin::metrics::set_source("opentelemetry", |e| {
            for (name, help, c) in [
                ("opentelemetry_spans_exported_total", "Spans the collector accepted.", &export::EXPORTED),
                (
                    "opentelemetry_spans_dropped_total",
                    "Spans dropped because the export queue was full.",
                    &export::DROPPED,
                ),
                ("opentelemetry_spans_failed_total", "Spans of exports that failed or timed out.", &export::FAILED),
                ("opentelemetry_exports_failed_total", "Exports that failed or timed out.", &export::EXPORTS_FAILED),
            ] {
                e.family(name, "counter", help);
                e.sample(name, &[], c.load(Ordering::Relaxed));
            }
            e.family("opentelemetry_queue_spans", "gauge", "Spans waiting for export or being exported.");
            e.sample("opentelemetry_queue_spans", &[], export::queued());
        });
        Ok(())
    }
    fn shutdown(&self) {
        // The spans of the last requests: sent before the process exits, within the timeout.
        let wait = export::request_timeout().unwrap_or(Duration::from_secs(3)) + Duration::from_secs(1);
        export::flush(wait);
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let sampler = Sampler::compile(&conf.sampler).map_err(|e| format!("sampler.{e}"))?;
        let mut attributes = Vec::with_capacity(conf.additional_attributes.len());
        for (i, a) in conf.additional_attributes.iter().enumerate() {
            let name = a.strip_prefix('$').unwrap_or(a);
            if !weir_plugin::template::is_known(name) {
                return Err(format!("additional_attributes[{i}]: unknown variable `{a}`"));
            }
            attributes.push(name.to_owned());
        }
        let mut header_prefixes = Vec::new();
        for (i, p) in conf.additional_header_prefix_attributes.iter().enumerate() {
            if p.is_empty() || http::HeaderName::from_bytes(p.as_bytes()).is_err() {
                return Err(format!("additional_header_prefix_attributes[{i}]: `{p}` is not a header name prefix"));
            }
            header_prefixes.push(p.to_ascii_lowercase());
        }
        Ok(Arc::new(Instance { sampler, plugin_spans: conf.plugin_spans, attributes, header_prefixes }))
    }
}

register_plugin!(OpenTelemetry);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_by_the_w3c_rules() {
        let ok = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let p = parse_traceparent(ok).unwrap_or_else(|| panic!("valid"));
        assert_eq!(p.span_id, [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]);
        assert!(p.sampled);
        assert!(
            parse_traceparent(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00").is_some_and(|p| !p.sampled)
        );
        for bad in [
            &b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"[..],
            b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"00-00000000000000000000000000000000-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
            b"garbage",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{}", String::from_utf8_lossy(bad));
        }
        // A later version may append fields.
        assert!(parse_traceparent(b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what").is_some());
    }

    #[test]
    fn settings_warn_about_what_is_ignored_and_refuse_bad_addresses() {
        let attr: Attr = serde_json::from_value(serde_json::json!({
            "collector": {"address": "http://127.0.0.1:4318/"},
            "batch_span_processor": {"drop_on_queue_full": false},
            "set_ngx_var": true
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let (s, warnings) = settings(&attr).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.address, "127.0.0.1:4318");
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("batch_span_processor.drop_on_queue_full"));
        let bad: Attr = serde_json::from_value(serde_json::json!({"collector": {"address": "localhost"}}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(settings(&bad).is_err_and(|e| e.starts_with("collector.address")));
    }
}
