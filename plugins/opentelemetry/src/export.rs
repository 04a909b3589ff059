//! Spans off the request path: a bounded queue (in spans) that the log phase pushes finished
//! requests into without waiting, and an exporter thread that batches them and sends them to
//! the collector by OTLP/HTTP (protobuf) or OTLP/gRPC.
//!
//! A request never waits for the collector: when the queue holds `max_queue_size` spans, the
//! request's spans are dropped and counted (`opentelemetry_spans_dropped_total`). The exporter
//! thread owns its own current-thread runtime, its HTTP/1.1 connection or gRPC channel; an
//! export that fails or takes longer than `request_timeout` is counted and not retried.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::otlp::{self, Batch, Kind, SpanHead, Val};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use weir_plugin::measure::{Attempt, PhaseTime, TraceContext};

/// How spans are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with a protobuf body, `POST /v1/traces`.
    Http,
    /// OTLP/gRPC, `TraceService/Export`.
    Grpc,
}

/// The exporter's settings (`plugin_attr.opentelemetry`), read at each export: a reload's
/// change applies to the next batch.
#[derive(Debug, Clone)]
pub struct Settings {
    pub protocol: Protocol,
    /// `host:port`.
    pub address: String,
    pub request_timeout: Duration,
    pub request_headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The `Resource` message's fields, encoded once ([`resource_attr`]).
    pub resource: Vec<u8>,
    pub max_queue_size: usize,
    pub batch_timeout: Duration,
    pub inactive_timeout: Duration,
    pub max_export_batch_size: usize,
}

/// One sampled request, as the log phase hands it over: converted to spans on the exporter
/// thread, not on the request path.
pub struct Record {
    pub trace: TraceContext,
    pub start: Instant,
    pub end: Instant,
    pub method: http::Method,
    pub path: String,
    pub route_pattern: Option<Arc<str>>,
    pub route_id: Option<Arc<str>>,
    pub consumer: Option<Arc<str>>,
    pub client: Arc<str>,
    pub client_port: u16,
    pub server_address: Option<String>,
    pub server_port: u16,
    pub scheme: &'static str,
    pub status: u16,
    pub attempts: Vec<Attempt>,
    pub phases: Vec<PhaseTime>,
    pub extra: Vec<(String, String)>,
}

impl Record {
    /// How many spans it makes: the server span, one per attempt, one per plugin phase.
    pub fn spans(&self) -> usize {
        1 + self.attempts.len() + self.phases.len()
    }
}

/// Counters, read by the scrape.
pub static EXPORTED: AtomicU64 = AtomicU64::new(0);
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
pub static FAILED: AtomicU64 = AtomicU64::new(0);
pub static EXPORTS_FAILED: AtomicU64 = AtomicU64::new(0);

/// The queue between the log phase and the exporter thread. A push takes an uncontended lock
/// and wakes the exporter only when it has something to start on (the first span into an
/// empty queue, or a full batch): under load, one wake-up per batch, not per request.
struct Queue {
    pending: Mutex<Vec<Record>>,
    /// Spans in `pending` (changed under its lock).
    pending_spans: AtomicUsize,
    /// Spans queued or being exported: the bound.
    queued: AtomicUsize,
    max: AtomicUsize,
    /// `max_export_batch_size`: a push that fills a batch wakes the exporter.
    batch: AtomicUsize,
    wake: tokio::sync::Notify,
    /// Graceful stops waiting for what was queued before them.
    flushes: Mutex<Vec<std::sync::mpsc::Sender<()>>>,
}

static QUEUE: OnceLock<Queue> = OnceLock::new();
static SETTINGS: Mutex<Option<Arc<Settings>>> = Mutex::new(None);

fn settings() -> Option<Arc<Settings>> {
    SETTINGS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The collector's `request_timeout` in force.
pub fn request_timeout() -> Option<Duration> {
    settings().map(|s| s.request_timeout)
}

/// Spans waiting or being exported.
pub fn queued() -> usize {
    QUEUE.get().map_or(0, |q| q.queued.load(Ordering::Relaxed))
}

/// Sets the exporter's settings, and starts the exporter thread the first time.
pub fn configure(s: Settings) -> Result<(), String> {
    let (max, batch) = (s.max_queue_size, s.max_export_batch_size);
    *SETTINGS.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(s));
    if let Some(q) = QUEUE.get() {
        q.max.store(max, Ordering::Relaxed);
        q.batch.store(batch, Ordering::Relaxed);
        return Ok(());
    }
    let _ = QUEUE.set(Queue {
        pending: Mutex::new(Vec::new()),
        pending_spans: AtomicUsize::new(0),
        queued: AtomicUsize::new(0),
        max: AtomicUsize::new(max),
        batch: AtomicUsize::new(batch),
        wake: tokio::sync::Notify::new(),
        flushes: Mutex::new(Vec::new()),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("opentelemetry: cannot start the exporter's runtime: {e}"))?;
    std::thread::Builder::new()
        .name("otel-exporter".into())
        .spawn(move || runtime.block_on(run()))
        .map_err(|e| format!("opentelemetry: cannot start the exporter thread: {e}"))?;
    Ok(())
}

/// Queues a finished request's spans; never waits. Drops them (counted) when the queue is full.
pub fn push(record: Record) {
    let Some(q) = QUEUE.get() else { return };
    let n = record.spans();
    let before = q.queued.fetch_add(n, Ordering::Relaxed);
    if before + n > q.max.load(Ordering::Relaxed) {
        q.queued.fetch_sub(n, Ordering::Relaxed);
        DROPPED.fetch_add(n as u64, Ordering::Relaxed);
        return;
    }
    let waiting = {
        let mut pending = q.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.push(record);
        q.pending_spans.fetch_add(n, Ordering::Relaxed)
    };
    let batch = q.batch.load(Ordering::Relaxed);
    if waiting == 0 || (waiting < batch && waiting + n >= batch) {
        q.wake.notify_one();
    }
}

/// Exports what was queued before this call, waiting at most `wait` (a graceful stop).
pub fn flush(wait: Duration) {
    let Some(q) = QUEUE.get() else { return };
    let (tx, rx) = std::sync::mpsc::channel();
    q.flushes.lock().unwrap_or_else(|e| e.into_inner()).push(tx);
    q.wake.notify_one();
    let _ = rx.recv_timeout(wait);
}

/// The exporter: once woken, collects for at most `batch_timeout`, until a batch is full
/// (`max_export_batch_size` spans) or nothing came for `inactive_timeout`, then exports
/// everything queued, a batch per request to the collector, and waits again.
async fn run() {
    let Some(q) = QUEUE.get() else { return };
    let mut exporter = Exporter::default();
    let mut warned = false;
    let flush_asked = || !q.flushes.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
    loop {
        q.wake.notified().await;
        let Some(s) = settings() else { continue };
        let started = Instant::now();
        let mut seen = q.pending_spans.load(Ordering::Relaxed);
        while seen < s.max_export_batch_size && !flush_asked() {
            let left = s.batch_timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            let woken = tokio::time::timeout(left.min(s.inactive_timeout), q.wake.notified()).await.is_ok();
            let now = q.pending_spans.load(Ordering::Relaxed);
            if !woken && now == seen {
                // Nothing new for `inactive_timeout`.
                break;
            }
            seen = now;
        }
        // The stops asked before the queue is taken: all they wait for is in it.
        let flushed = std::mem::take(&mut *q.flushes.lock().unwrap_or_else(|e| e.into_inner()));
        let batch = {
            let mut pending = q.pending.lock().unwrap_or_else(|e| e.into_inner());
            let batch = std::mem::take(&mut *pending);
            q.pending_spans.fetch_sub(batch.iter().map(|r| r.spans()).sum(), Ordering::Relaxed);
            batch
        };
        let mut records = batch.as_slice();
        while !records.is_empty() {
            let (mut take, mut spans) = (0, 0);
            while take < records.len() && (take == 0 || spans + records[take].spans() <= s.max_export_batch_size) {
                spans += records[take].spans();
                take += 1;
            }
            write_spans(&mut exporter.batch, &records[..take]);
            records = &records[take..];
            let body = exporter.batch.finish(&s.resource);
            match exporter.export(&s, body).await {
                Ok(()) => {
                    EXPORTED.fetch_add(spans as u64, Ordering::Relaxed);
                    warned = false;
                }
                Err(e) => {
                    FAILED.fetch_add(spans as u64, Ordering::Relaxed);
                    EXPORTS_FAILED.fetch_add(1, Ordering::Relaxed);
                    // Once per outage, not once per batch.
                    if !warned {
                        log::warn!("opentelemetry: export to {} failed ({spans} spans dropped): {e}", s.address);
                        warned = true;
                    }
                }
            }
            q.queued.fetch_sub(spans, Ordering::Relaxed);
        }
        drop(batch);
        for done in flushed {
            let _ = done.send(());
        }
    }
}

/// The collector connection: an HTTP/1.1 keep-alive connection or a gRPC channel, made on
/// first use and again after a failure or a change of address.
#[derive(Default)]
struct Exporter {
    http: Option<(String, hyper::client::conn::http1::SendRequest<Full<Bytes>>)>,
    grpc: Option<(String, tonic::client::Grpc<tonic::transport::Channel>)>,
    /// The spans being encoded (its buffers kept from batch to batch).
    batch: Batch,
}

impl Exporter {
    /// Sends one `ExportTraceServiceRequest` (encoded).
    async fn export(&mut self, s: &Settings, body: Bytes) -> Result<(), String> {
        match s.protocol {
            Protocol::Http => match tokio::time::timeout(s.request_timeout, self.post(s, body)).await {
                Ok(r) => r.inspect_err(|_| self.http = None),
                Err(_) => {
                    self.http = None;
                    Err(format!("no answer within {:?}", s.request_timeout))
                }
            },
            Protocol::Grpc => self.grpc_export(s, body).await,
        }
    }

    async fn post(&mut self, s: &Settings, body: Bytes) -> Result<(), String> {
        let reusable = matches!(&self.http, Some((addr, tx)) if *addr == s.address && !tx.is_closed());
        if !reusable {
            let tcp = tokio::net::TcpStream::connect(&s.address).await.map_err(|e| format!("connect: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let (tx, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.http = Some((s.address.clone(), tx));
        }
        let Some((_, tx)) = self.http.as_mut() else { return Err("no connection".into()) };
        tx.ready().await.map_err(|e| format!("connection: {e}"))?;
        let mut req = http::Request::new(Full::new(body));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = http::Uri::from_static("/v1/traces");
        let h = req.headers_mut();
        if let Ok(host) = http::HeaderValue::from_str(&s.address) {
            h.insert(http::header::HOST, host);
        }
        h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/x-protobuf"));
        for (k, v) in &s.request_headers {
            h.insert(k.clone(), v.clone());
        }
        let resp = tx.send_request(req).await.map_err(|e| format!("request: {e}"))?;
        let status = resp.status();
        // Read to the end, so that the connection can serve the next batch.
        let _ = resp.into_body().collect().await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("collector answered {status}"))
        }
    }

    async fn grpc_export(&mut self, s: &Settings, body: Bytes) -> Result<(), String> {
        if !matches!(&self.grpc, Some((addr, _)) if *addr == s.address) {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", s.address))
                .map_err(|e| format!("address: {e}"))?
                .connect_timeout(s.request_timeout)
                .timeout(s.request_timeout);
            self.grpc = Some((s.address.clone(), tonic::client::Grpc::new(endpoint.connect_lazy())));
        }
        let Some((_, client)) = self.grpc.as_mut() else { return Err("no channel".into()) };
        let mut req = tonic::Request::new(body);
        req.set_timeout(s.request_timeout);
        for (k, v) in &s.request_headers {
            let key = tonic::metadata::MetadataKey::from_bytes(k.as_str().as_bytes());
            let value = v.to_str().ok().and_then(|v| tonic::metadata::MetadataValue::try_from(v).ok());
            if let (Ok(key), Some(value)) = (key, value) {
                req.metadata_mut().insert(key, value);
            }
        }
        let path = http::uri::PathAndQuery::from_static("/opentelemetry.proto.collector.trace.v1.TraceService/Export");
        let call = async {
            client.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            client.unary(req, path, otlp::RawCodec).await
        };
        match tokio::time::timeout(s.request_timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(format!("collector answered {:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {:?}", s.request_timeout)),
        }
    }
}

/// Appends a resource attribute from `plugin_attr.opentelemetry.resource` to `out` (the
/// `Resource` message's fields); `None` for a value that is not a string, number or boolean.
pub fn resource_attr(out: &mut Vec<u8>, key: &str, value: &serde_json::Value) -> Option<()> {
    let v = match value {
        serde_json::Value::String(s) => Val::Str(s),
        serde_json::Value::Bool(b) => Val::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Val::Int(i),
            None => Val::Double(n.as_f64()?),
        },
        _ => return None,
    };
    otlp::key_value(out, 1, key, v);
    Some(())
}

/// Writes the spans of `records` into `batch`.
fn write_spans(batch: &mut Batch, records: &[Record]) {
    // Instants to Unix time: one pair of clock readings for the batch.
    let (wall, mono) = (SystemTime::now(), Instant::now());
    let wall_nanos = wall.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let unix = |t: Instant| {
        wall_nanos.saturating_sub(u64::try_from(mono.saturating_duration_since(t).as_nanos()).unwrap_or(0))
    };
    let mut ip_text = String::with_capacity(48);
    for r in records {
        let trace_id = &r.trace.trace_id;
        let server_id = &r.trace.span_id;
        let trace_state = r.trace.state.as_ref().and_then(|s| s.to_str().ok()).unwrap_or("");
        let method = r.method.as_str();
        let route = r.route_pattern.as_deref();
        let name: &[&str] = match route {
            Some(route) => &[method, " ", route],
            None => &[method],
        };
        let mut w = batch.span(&SpanHead {
            trace_id,
            span_id: server_id,
            parent_id: r.trace.parent_id.as_ref(),
            trace_state,
            name,
            kind: Kind::Server,
            start_unix_nano: unix(r.start),
            end_unix_nano: unix(r.end),
        });
        w.text("http.request.method", method)
            .text("url.path", &r.path)
            .text("url.scheme", r.scheme)
            .int("http.response.status_code", i64::from(r.status))
            .text("client.address", &r.client)
            .int("client.port", i64::from(r.client_port))
            .int("server.port", i64::from(r.server_port));
        if let Some(route) = route {
            w.text("http.route", route);
        }
        if let Some(host) = &r.server_address {
            w.text("server.address", host);
        }
        if let Some(id) = &r.route_id {
            w.text("weir.route.id", id);
        }
        if let Some(c) = &r.consumer {
            w.text("weir.consumer", c);
        }
        for (k, v) in &r.extra {
            w.text(k, v);
        }
        // A server span is an error for a 5xx only (the semantic conventions).
        if r.status >= 500 {
            w.error("");
        }
        w.end();
        for (i, a) in r.attempts.iter().enumerate() {
            ip_text.clear();
            let _ = std::fmt::Write::write_fmt(&mut ip_text, format_args!("{}", a.node.ip()));
            let mut w = batch.span(&SpanHead {
                trace_id,
                span_id: &a.span_id,
                parent_id: Some(server_id),
                trace_state,
                name: &[method, " upstream"],
                kind: Kind::Client,
                start_unix_nano: unix(a.start),
                end_unix_nano: unix(a.end),
            });
            w.text("http.request.method", method)
                .text("server.address", &ip_text)
                .int("server.port", i64::from(a.node.port()))
                .text("network.peer.address", &ip_text);
            if i > 0 {
                w.int("http.request.resend_count", i as i64);
            }
            if let Some(code) = a.status {
                w.int("http.response.status_code", i64::from(code));
            }
            match (&a.error, a.status) {
                (Some(e), _) => {
                    w.text("error.type", e).error(e);
                }
                (None, Some(code)) if code >= 400 => {
                    let mut digits = [0u8; 5];
                    w.text("error.type", status_text(code, &mut digits)).error("");
                }
                _ => {}
            }
            w.end();
        }
        for p in &r.phases {
            let span_id = weir_plugin::measure::new_span_id();
            let mut w = batch.span(&SpanHead {
                trace_id,
                span_id: &span_id,
                parent_id: Some(server_id),
                trace_state,
                name: &[p.plugin, " ", p.phase.as_str()],
                kind: Kind::Internal,
                start_unix_nano: unix(p.start),
                end_unix_nano: unix(p.end),
            });
            w.text("weir.plugin", p.plugin)
                .text("weir.phase", p.phase.as_str())
                .int("weir.busy_ns", i64::try_from(p.busy.as_nanos()).unwrap_or(i64::MAX));
            w.end();
        }
    }
}

/// A status code as text, in `digits`.
fn status_text(code: u16, digits: &mut [u8; 5]) -> &str {
    let mut n = code;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    std::str::from_utf8(&digits[i..]).unwrap_or("")
}

/// Whether `address` is `host:port` (a port is required).
pub fn check_address(address: &str) -> Result<(), String> {
    if address.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("`{address}` is not `host:port`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_as_text() {
        for code in [0u16, 7, 404, 503, 65535] {
            let mut digits = [0u8; 5];
            assert_eq!(status_text(code, &mut digits), code.to_string());
        }
    }
}
