//! The one batch processor of the log sinks (http-logger, tcp-logger, udp-logger, syslog):
//! APISIX's `batch_max_size`, `inactive_timeout`, `buffer_duration`, `max_retry_count` and
//! `retry_delay` (same names, defaults and bounds), bounded in entries and in bytes.
//!
//! The log phase only enqueues ([`Processor::push`]): a short lock of the processor's queue, no
//! wait, no I/O. A full queue (`max_pending_entries` or `max_pending_bytes`, entries being
//! sent included) drops the entry and counts it. Delivery runs as a task of its own on the
//! worker that pushed when none was running (through [`HttpClient::spawn`], the SDK's detached
//! tasks): it takes a batch when `batch_max_size` entries wait, when no entry came for
//! `inactive_timeout` seconds, or when the oldest waited `buffer_duration` seconds, hands it to
//! the plugin's [`Sink`], retries a failed batch `max_retry_count` times `retry_delay` seconds
//! apart, then drops it (counted). One batch of a processor is in flight at a time, so a sink
//! that hangs holds at most one batch and one connection, and the queue's bound holds the rest;
//! the task ends when the queue is empty. Entries still queued when the process stops are lost,
//! as in APISIX.
//!
//! Every processor counts into the [`SinkStats`] of its plugin and resource, exposed as
//! `weir_log_sink_*` metrics (see [`register_metrics`]).
//!
//! ```
//! use std::sync::Arc;
//! use weir_plugin::batch::{BatchConf, Limits, Processor, SendFuture, Sink};
//! use weir_plugin::{NoServices, Owner, Services};
//!
//! struct Nowhere;
//! impl Sink for Nowhere {
//!     fn send<'a>(&'a self, _batch: &'a [String]) -> SendFuture<'a> {
//!         Box::pin(async { Err("nowhere".to_string()) })
//!     }
//! }
//!
//! let conf: BatchConf = serde_json::from_value(serde_json::json!({"batch_max_size": 2})).unwrap();
//! let owner = Owner { kind: "routes", id: "r1", label: "routes[0] (id r1)" };
//! let p = Processor::new("doc-logger", &owner, &conf, Limits::default(), Nowhere, NoServices.http_client());
//! // No worker here to deliver on: the entry is dropped, and counted.
//! assert!(!p.push("{}".to_string()));
//! assert_eq!(p.stats().dropped_full(), 1);
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// Tokio's clock: the same as std's, but paused in tests.
use tokio::time::Instant;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::log_entry::{BodyConf, EntryBuilder};
use crate::metrics::Exposition;
use crate::phase::{BodyFilter, Flow, Late, PluginInstance, ResponseHead};
use crate::services::HttpClient;
use crate::{BuildContext, Owner, RequestCtx};

fn d_batch_max_size() -> u32 {
    1000
}
fn d_inactive_timeout() -> u32 {
    5
}
fn d_buffer_duration() -> u32 {
    60
}
fn d_retry_delay() -> u32 {
    1
}

/// APISIX's batch processor fields, flattened into each sink plugin's configuration.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct BatchConf {
    /// Name of the processor in log messages (APISIX's `name`; default: the plugin's).
    #[serde(default)]
    pub name: Option<String>,
    /// Entries per batch; a batch is sent as soon as it is full.
    #[serde(default = "d_batch_max_size")]
    #[schemars(range(min = 1))]
    pub batch_max_size: u32,
    /// Seconds without a new entry after which the waiting entries are sent.
    #[serde(default = "d_inactive_timeout")]
    #[schemars(range(min = 1))]
    pub inactive_timeout: u32,
    /// Seconds the oldest waiting entry may wait before the batch is sent.
    #[serde(default = "d_buffer_duration")]
    #[schemars(range(min = 1))]
    pub buffer_duration: u32,
    /// Times a failed batch is sent again before it is dropped.
    #[serde(default)]
    pub max_retry_count: u32,
    /// Seconds between two attempts of a failed batch.
    #[serde(default = "d_retry_delay")]
    pub retry_delay: u32,
}

/// `max_pending_entries`' default (APISIX's).
pub const DEFAULT_MAX_PENDING_ENTRIES: usize = 8192;
/// `max_pending_bytes`' default.
pub const DEFAULT_MAX_PENDING_BYTES: usize = 16 << 20;

fn d_max_pending_entries() -> usize {
    DEFAULT_MAX_PENDING_ENTRIES
}
fn d_max_pending_bytes() -> usize {
    DEFAULT_MAX_PENDING_BYTES
}

/// The plugin metadata of every sink plugin: APISIX's `log_format` and `max_pending_entries`,
/// and Weir's `max_pending_bytes`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SinkMetadata {
    /// Field name → `$variable`, text, or a nested object: the entry's shape for every
    /// configuration of the plugin without a `log_format` of its own.
    #[serde(default)]
    pub log_format: Option<Map<String, Value>>,
    /// Entries a processor holds (waiting and being sent) before new ones are dropped.
    #[serde(default = "d_max_pending_entries")]
    #[schemars(range(min = 1))]
    pub max_pending_entries: usize,
    /// Bytes of entries a processor holds (waiting and being sent) before new ones are dropped.
    #[serde(default = "d_max_pending_bytes")]
    #[schemars(range(min = 1024))]
    pub max_pending_bytes: usize,
}

impl Default for SinkMetadata {
    fn default() -> Self {
        SinkMetadata {
            log_format: None,
            max_pending_entries: DEFAULT_MAX_PENDING_ENTRIES,
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
        }
    }
}

/// A processor's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries held, waiting and being sent.
    pub max_entries: usize,
    /// Bytes of entries held, waiting and being sent.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_entries: DEFAULT_MAX_PENDING_ENTRIES, max_bytes: DEFAULT_MAX_PENDING_BYTES }
    }
}

impl From<&SinkMetadata> for Limits {
    fn from(m: &SinkMetadata) -> Self {
        Limits { max_entries: m.max_pending_entries, max_bytes: m.max_pending_bytes }
    }
}

/// The future of [`Sink::send`]: runs on the worker that delivers (need not be `Send`).
pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + 'a>>;

/// Where a plugin's batches go.
pub trait Sink: Send + Sync + 'static {
    /// Delivers one batch (entries in order, as pushed); an error is retried, then the batch
    /// dropped. It must end by itself (a timeout of the plugin's).
    fn send<'a>(&'a self, batch: &'a [String]) -> SendFuture<'a>;
}

/// What a plugin's processors of one resource did, exposed as metrics.
#[derive(Debug, Default)]
pub struct SinkStats {
    sent: AtomicU64,
    dropped_full: AtomicU64,
    dropped_failed: AtomicU64,
    batches_sent: AtomicU64,
    batches_failed: AtomicU64,
    retries: AtomicU64,
    pending_entries: AtomicI64,
    pending_bytes: AtomicI64,
}

impl SinkStats {
    /// Entries delivered.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
    /// Entries dropped because the processor was full.
    pub fn dropped_full(&self) -> u64 {
        self.dropped_full.load(Ordering::Relaxed)
    }
    /// Entries dropped with a batch that failed every attempt.
    pub fn dropped_failed(&self) -> u64 {
        self.dropped_failed.load(Ordering::Relaxed)
    }
    /// Entries held now (waiting and being sent).
    pub fn pending_entries(&self) -> i64 {
        self.pending_entries.load(Ordering::Relaxed)
    }
    /// Bytes of the entries held now.
    pub fn pending_bytes(&self) -> i64 {
        self.pending_bytes.load(Ordering::Relaxed)
    }
}

type StatsKey = (&'static str, &'static str, String);

static STATS: Mutex<Vec<(StatsKey, Arc<SinkStats>)>> = Mutex::new(Vec::new());

fn stats_of(plugin: &'static str, owner: &Owner<'_>) -> Arc<SinkStats> {
    let mut all = STATS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, s)) = all.iter().find(|((p, k, id), _)| *p == plugin && *k == owner.kind && id == owner.id) {
        return s.clone();
    }
    let s = Arc::new(SinkStats::default());
    all.push(((plugin, owner.kind, owner.id.to_owned()), s.clone()));
    s
}

/// Registers the `log_sinks` metrics source (idempotent; call it from `Plugin::init`):
///
/// - `weir_log_sink_sent_total{plugin,resource,id}`: entries delivered;
/// - `weir_log_sink_dropped_total{plugin,resource,id,reason}`: entries dropped, `reason="full"`
///   (the processor held `max_pending_entries` or `max_pending_bytes`) or `"failed"` (their batch
///   failed `1 + max_retry_count` times);
/// - `weir_log_sink_batches_total{plugin,resource,id,outcome="sent|failed"}` and
///   `weir_log_sink_retries_total{...}`;
/// - `weir_log_sink_pending_entries{...}` and `weir_log_sink_pending_bytes{...}` (gauges).
///
/// `resource` is the list of the resource carrying the configuration (`routes`, `services`,
/// `global_rules`...) and `id` its id.
pub fn register_metrics() {
    crate::metrics::set_source("log_sinks", expose);
}

fn expose(e: &mut Exposition) {
    let all: Vec<(StatsKey, Arc<SinkStats>)> = STATS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if all.is_empty() {
        return;
    }
    type Read = fn(&SinkStats) -> u64;
    /// (label, value, reader) of one sample of a family.
    type Sample<'s> = (&'s str, &'s str, Read);
    let families: [(&str, &str, &str, &[Sample<'_>]); 4] = [
        ("log_sink_sent_total", "counter", "Log entries delivered by a sink.", &[("", "", |s| s.sent())]),
        (
            "log_sink_dropped_total",
            "counter",
            "Log entries dropped: the sink's queue was full (reason=full), or their batch failed every attempt (reason=failed).",
            &[("reason", "full", |s| s.dropped_full()), ("reason", "failed", |s| s.dropped_failed())],
        ),
        (
            "log_sink_batches_total",
            "counter",
            "Batches handed to a sink, by outcome.",
            &[
                ("outcome", "sent", |s| s.batches_sent.load(Ordering::Relaxed)),
                ("outcome", "failed", |s| s.batches_failed.load(Ordering::Relaxed)),
            ],
        ),
        (
            "log_sink_retries_total",
            "counter",
            "Attempts of failed batches sent again.",
            &[("", "", |s| s.retries.load(Ordering::Relaxed))],
        ),
    ];
    for (name, kind, help, samples) in families {
        e.family(name, kind, help);
        for ((plugin, kind, id), s) in &all {
            for (label, value, read) in samples {
                let mut labels = vec![("plugin", *plugin), ("resource", *kind), ("id", id.as_str())];
                if !label.is_empty() {
                    labels.push((label, value));
                }
                e.sample(name, &labels, read(s));
            }
        }
    }
    for (name, help, read) in [
        (
            "log_sink_pending_entries",
            "Log entries a sink holds (waiting and being sent).",
            SinkStats::pending_entries as fn(&SinkStats) -> i64,
        ),
        ("log_sink_pending_bytes", "Bytes of the log entries a sink holds.", SinkStats::pending_bytes),
    ] {
        e.family(name, "gauge", help);
        for ((plugin, kind, id), s) in &all {
            e.sample(name, &[("plugin", plugin), ("resource", kind), ("id", id.as_str())], read(s));
        }
    }
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<String>,
    waiting_bytes: usize,
    /// The batch being sent.
    sending: usize,
    sending_bytes: usize,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    /// A delivery task runs.
    running: bool,
}

/// A batch processor (see the module documentation). Made in `build`, one per configuration.
pub struct Processor {
    name: String,
    batch_max_size: usize,
    inactive: Duration,
    buffer: Duration,
    retries: u32,
    retry_delay: Duration,
    limits: Limits,
    sink: Box<dyn Sink>,
    spawner: Arc<dyn HttpClient>,
    queue: Mutex<Queue>,
    wake: tokio::sync::Notify,
    stats: Arc<SinkStats>,
    failures: AtomicU64,
}

impl Processor {
    /// A processor of `plugin` on `owner`'s configuration, delivering to `sink` on the workers
    /// of `spawner` (the host's client: `ctx.services.http_client()`).
    pub fn new(
        plugin: &'static str,
        owner: &Owner<'_>,
        conf: &BatchConf,
        limits: Limits,
        sink: impl Sink,
        spawner: Arc<dyn HttpClient>,
    ) -> Arc<Processor> {
        Arc::new(Processor {
            name: conf.name.clone().unwrap_or_else(|| plugin.to_owned()),
            batch_max_size: conf.batch_max_size.max(1) as usize,
            inactive: Duration::from_secs(conf.inactive_timeout.max(1).into()),
            buffer: Duration::from_secs(conf.buffer_duration.max(1).into()),
            retries: conf.max_retry_count,
            retry_delay: Duration::from_secs(conf.retry_delay.into()),
            limits,
            sink: Box::new(sink),
            spawner,
            queue: Mutex::new(Queue::default()),
            wake: tokio::sync::Notify::new(),
            stats: stats_of(plugin, owner),
            failures: AtomicU64::new(0),
        })
    }

    /// The counters this processor writes (shared with the plugin's other processors of the
    /// same resource).
    pub fn stats(&self) -> &Arc<SinkStats> {
        &self.stats
    }

    /// The most entries a batch has.
    pub fn batch_max_size(&self) -> usize {
        self.batch_max_size
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn dropped(&self) -> bool {
        let n = self.stats.dropped_full.fetch_add(1, Ordering::Relaxed);
        if (n + 1).is_power_of_two() {
            log::warn!("{}: the log sink is behind, {} entries dropped so far", self.name, n + 1);
        }
        false
    }

    /// As [`Processor::push`], but the entry is made only when there is room for one more
    /// (a sink that is behind costs the request no entry it would drop).
    pub fn push_with(self: &Arc<Self>, make: impl FnOnce() -> String) -> bool {
        let full = {
            let q = self.lock();
            q.waiting.len() + q.sending >= self.limits.max_entries
                || q.waiting_bytes + q.sending_bytes >= self.limits.max_bytes
        };
        if full {
            return self.dropped();
        }
        self.push(make())
    }

    /// Queues one entry; never waits. `false` when it was dropped (counted): the processor is
    /// full, or there is no worker to deliver on.
    pub fn push(self: &Arc<Self>, entry: String) -> bool {
        let len = entry.len();
        let now = Instant::now();
        let (start, full) = {
            let mut q = self.lock();
            let entries = q.waiting.len() + q.sending;
            let bytes = q.waiting_bytes + q.sending_bytes;
            if entries >= self.limits.max_entries || bytes + len > self.limits.max_bytes {
                drop(q);
                return self.dropped();
            }
            if q.waiting.is_empty() {
                q.first_at = Some(now);
            }
            q.last_at = Some(now);
            q.waiting.push_back(entry);
            q.waiting_bytes += len;
            let start = !q.running;
            q.running = true;
            (start, q.waiting.len() >= self.batch_max_size)
        };
        self.stats.pending_entries.fetch_add(1, Ordering::Relaxed);
        self.stats.pending_bytes.fetch_add(len as i64, Ordering::Relaxed);
        if start {
            let me = self.clone();
            if !self.spawner.spawn(Box::pin(async move { me.deliver().await })) {
                // No worker here (a test without a host): nothing will send what waits.
                let mut q = self.lock();
                q.running = false;
                let n = q.waiting.len();
                let bytes = std::mem::take(&mut q.waiting_bytes);
                q.waiting.clear();
                drop(q);
                self.stats.pending_entries.fetch_sub(n as i64, Ordering::Relaxed);
                self.stats.pending_bytes.fetch_sub(bytes as i64, Ordering::Relaxed);
                self.stats.dropped_full.fetch_add(n as u64, Ordering::Relaxed);
                return false;
            }
        } else if full {
            self.wake.notify_one();
        }
        true
    }

    /// The next batch when one is due, else how long until one is.
    fn take(&self) -> Result<Option<Vec<String>>, Duration> {
        let mut q = self.lock();
        if q.waiting.is_empty() {
            q.running = false;
            return Ok(None);
        }
        let now = Instant::now();
        let due = match (q.last_at, q.first_at) {
            (Some(last), Some(first)) => (last + self.inactive).min(first + self.buffer),
            _ => now,
        };
        if q.waiting.len() < self.batch_max_size && now < due {
            return Err(due - now);
        }
        let n = q.waiting.len().min(self.batch_max_size);
        let batch: Vec<String> = q.waiting.drain(..n).collect();
        let bytes: usize = batch.iter().map(String::len).sum();
        q.waiting_bytes -= bytes;
        q.sending = n;
        q.sending_bytes = bytes;
        // What stays waits for a batch of its own, aged from now.
        q.first_at = (!q.waiting.is_empty()).then_some(now);
        Ok(Some(batch))
    }

    async fn deliver(self: Arc<Self>) {
        loop {
            let batch = match self.take() {
                Ok(Some(batch)) => batch,
                Ok(None) => return,
                Err(wait) => {
                    // A full batch wakes it early.
                    let _ = tokio::time::timeout(wait, self.wake.notified()).await;
                    continue;
                }
            };
            let mut attempt = 0;
            let outcome = loop {
                match self.sink.send(&batch).await {
                    Ok(()) => break Ok(()),
                    Err(e) if attempt < self.retries => {
                        self.report(&e, attempt);
                        attempt += 1;
                        self.stats.retries.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(self.retry_delay).await;
                    }
                    Err(e) => break Err(e),
                }
            };
            let (n, bytes) = {
                let mut q = self.lock();
                let done = (q.sending, q.sending_bytes);
                q.sending = 0;
                q.sending_bytes = 0;
                done
            };
            self.stats.pending_entries.fetch_sub(n as i64, Ordering::Relaxed);
            self.stats.pending_bytes.fetch_sub(bytes as i64, Ordering::Relaxed);
            match outcome {
                Ok(()) => {
                    self.stats.sent.fetch_add(n as u64, Ordering::Relaxed);
                    self.stats.batches_sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.report(&e, attempt);
                    self.stats.dropped_failed.fetch_add(n as u64, Ordering::Relaxed);
                    self.stats.batches_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Logs a failed attempt: the first, then every power of two (a dead sink must not flood
    /// the error log).
    fn report(&self, e: &str, attempt: u32) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed);
        if (n + 1).is_power_of_two() {
            log::error!(
                "{}: sending a batch failed (attempt {}, {} failures so far): {e}",
                self.name,
                attempt + 1,
                n + 1
            );
        }
    }
}

/// How a sink plugin turns an entry into what its processor queues. The type is also the
/// plugin's marker of its per-request state ([`EntryBuilder`]).
pub trait Encode: Send + Sync + 'static {
    /// The queued text of `entry` (default: its JSON).
    fn encode(&self, _ctx: &RequestCtx, entry: Map<String, Value>) -> String {
        Value::Object(entry).to_string()
    }
}

/// A sink plugin's whole configuration: its own fields (`C`, without `deny_unknown_fields`:
/// this type refuses unknown keys), `log_format`, the body fields and the batch processor's.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SinkConf<C> {
    /// The plugin's own fields (`uri`, `host`, `port`...).
    #[serde(flatten)]
    pub own: C,
    /// This configuration's entry shape (wins over the plugin metadata's `log_format`).
    #[serde(default)]
    pub log_format: Option<Map<String, Value>>,
    /// `include_req_body`, `include_resp_body`, their expressions and size caps.
    #[serde(flatten)]
    pub body: BodyConf,
    /// `batch_max_size`, `inactive_timeout`, `buffer_duration`, `max_retry_count`, `retry_delay`.
    #[serde(flatten)]
    pub batch: BatchConf,
}

/// A log sink plugin: its identity, its own configuration fields and how it makes its
/// [`Sink`]. Implementing it implements [`Plugin`](crate::Plugin): configuration
/// [`SinkConf<Own>`], metadata [`SinkMetadata`], the metrics source registered in `init`, and
/// instances that build entries and queue them ([`LoggerInstance`]).
pub trait SinkPlugin: Send + Sync + 'static {
    /// The plugin's own fields.
    type Own: serde::de::DeserializeOwned + JsonSchema;
    /// Where batches go.
    type Sink: Sink;
    /// How entries are queued.
    type Encode: Encode;
    /// The plugin's name.
    const NAME: &'static str;
    /// Its priority.
    const PRIORITY: i32;
    /// The sink and encoder of one configuration; errors name the key.
    fn sink(
        &self,
        own: Self::Own,
        batch: &BatchConf,
        ctx: &BuildContext<'_>,
    ) -> Result<(Self::Sink, Self::Encode), String>;
}

impl<T: SinkPlugin> crate::Plugin for T {
    type Conf = SinkConf<T::Own>;
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn priority(&self) -> i32 {
        T::PRIORITY
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(crate::schema_of::<SinkMetadata>())
    }
    fn init(&self, _attr: Option<&Value>, _env: &crate::InitEnv) -> Result<(), String> {
        register_metrics();
        Ok(())
    }
    fn build(&self, conf: Self::Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let (sink, encode) = self.sink(conf.own, &conf.batch, ctx)?;
        LoggerInstance::build(T::NAME, ctx, conf.log_format.as_ref(), conf.body, &conf.batch, sink, encode)
    }
}

/// The request-side half of every sink plugin: builds the entry in the log phase (collecting
/// bodies and headers in the filters when configured) and pushes it to the processor.
pub struct LoggerInstance<E: Encode> {
    entries: EntryBuilder<E>,
    encode: E,
    /// `None` when only validating.
    processor: Option<Arc<Processor>>,
}

impl<E: Encode> LoggerInstance<E> {
    /// Builds a sink plugin's instance from its `log_format`, [`BodyConf`] and [`BatchConf`]
    /// (the fields every sink plugin has; flatten the last two into its `Conf`): the plugin metadata ([`SinkMetadata`]) read from `ctx`,
    /// formats compiled (errors name the key), a processor made unless `ctx.check_only`.
    pub fn build(
        plugin: &'static str,
        ctx: &BuildContext<'_>,
        log_format: Option<&Map<String, Value>>,
        body: BodyConf,
        batch: &BatchConf,
        sink: impl Sink,
        encode: E,
    ) -> Result<Arc<dyn PluginInstance>, String> {
        let meta = ctx.metadata_as::<SinkMetadata>()?.unwrap_or_default();
        let entries = EntryBuilder::new(log_format, meta.log_format.as_ref(), body)?;
        let processor = (!ctx.check_only)
            .then(|| Processor::new(plugin, &ctx.owner, batch, Limits::from(&meta), sink, ctx.services.http_client()));
        Ok(Arc::new(LoggerInstance { entries, encode, processor }))
    }
}

impl<E: Encode> PluginInstance for LoggerInstance<E> {
    fn wants_request_body(&self) -> bool {
        self.entries.wants_request_body()
    }
    fn late(&self) -> Late {
        self.entries.late()
    }
    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        self.entries.access(ctx);
        Flow::Continue
    }
    fn header_filter(&self, ctx: &mut RequestCtx, resp: &mut ResponseHead) -> BodyFilter {
        self.entries.header_filter(ctx, resp)
    }
    fn body_filter(&self, ctx: &mut RequestCtx, chunk: &mut bytes::Bytes, _eof: bool) {
        self.entries.body_filter(ctx, chunk);
    }
    fn log(&self, ctx: &RequestCtx) {
        if let Some(p) = &self.processor {
            p.push_with(|| self.encode.encode(ctx, self.entries.build(ctx)));
        }
    }
}

/// Resolves `host:port` (the first address), within `timeout`.
pub async fn resolve(host: &str, port: u16, timeout: Duration) -> Result<std::net::SocketAddr, String> {
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        return Ok(std::net::SocketAddr::new(ip, port));
    }
    let found = tokio::time::timeout(timeout, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| format!("resolving {host}: no answer within {timeout:?}"))?
        .map_err(|e| format!("resolving {host}: {e}"))?
        .next();
    found.ok_or_else(|| format!("{host} has no address"))
}

/// Connects to `host:port` over TCP, writes `payload` and closes: the whole within `timeout`
/// (a sink that accepts and stops reading fails the batch when it passes). tcp-logger's and
/// syslog's TCP delivery.
pub async fn tcp_send(host: &str, port: u16, timeout: Duration, payload: &[u8]) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let work = async {
        let addr = resolve(host, port, timeout).await?;
        let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connecting to {addr}: {e}"))?;
        s.write_all(payload).await.map_err(|e| format!("sending to {addr}: {e}"))?;
        s.shutdown().await.map_err(|e| format!("closing the connection to {addr}: {e}"))
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| format!("{host}:{port}: not sent within {timeout:?}"))?
}

/// The largest UDP payload sent in one datagram (IPv4's limit).
pub const MAX_DATAGRAM: usize = 65_507;

/// Sends each of `datagrams` to `host:port` over UDP from a fresh socket, within `timeout`.
/// udp-logger's and syslog's UDP delivery.
pub async fn udp_send<'a>(
    host: &str,
    port: u16,
    timeout: Duration,
    datagrams: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), String> {
    let work = async {
        let addr = resolve(host, port, timeout).await?;
        let local: std::net::SocketAddr =
            if addr.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
        let s = tokio::net::UdpSocket::bind(local).await.map_err(|e| format!("UDP socket: {e}"))?;
        s.connect(addr).await.map_err(|e| format!("UDP to {addr}: {e}"))?;
        for d in datagrams {
            s.send(d).await.map_err(|e| format!("sending {} bytes to {addr}: {e}", d.len()))?;
        }
        Ok(())
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| format!("{host}:{port}: not sent within {timeout:?}"))?
}

/// `entries` as one JSON text: the entry itself when batches hold one entry
/// (`batch_max_size: 1`), else a JSON array of them (APISIX's `json` concatenation).
pub fn json_array(entries: &[String], batch_max_size: usize) -> String {
    if batch_max_size == 1 && entries.len() == 1 {
        return entries[0].clone();
    }
    let mut out = String::with_capacity(entries.iter().map(|e| e.len() + 1).sum::<usize>() + 2);
    out.push('[');
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(e);
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::{LocalTask, OutboundRequest, SendFuture as HttpSend};

    /// Spawns on the test's `LocalSet`.
    struct Here;
    impl HttpClient for Here {
        fn send(&self, _req: OutboundRequest) -> HttpSend {
            unreachable!("not used")
        }
        fn spawn(&self, task: LocalTask) -> bool {
            tokio::task::spawn_local(task);
            true
        }
    }

    /// Records batches; fails the first `fail` attempts; never answers while `hang`.
    struct Recorder {
        got: Arc<Mutex<Vec<Vec<String>>>>,
        fail: Arc<AtomicU64>,
        hang: bool,
    }
    impl Sink for Recorder {
        fn send<'a>(&'a self, batch: &'a [String]) -> SendFuture<'a> {
            Box::pin(async move {
                if self.hang {
                    std::future::pending::<()>().await;
                }
                if self.fail.load(Ordering::Relaxed) > 0 {
                    self.fail.fetch_sub(1, Ordering::Relaxed);
                    return Err("refused".into());
                }
                self.got.lock().unwrap_or_else(|e| e.into_inner()).push(batch.to_vec());
                Ok(())
            })
        }
    }

    fn conf(v: Value) -> BatchConf {
        serde_json::from_value(v).expect("valid")
    }

    fn owner(id: &str) -> Owner<'_> {
        Owner { kind: "routes", id, label: "test" }
    }

    fn run(f: impl Future<Output = ()>) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("rt");
        tokio::task::LocalSet::new().block_on(&rt, f);
    }

    #[test]
    fn defaults_are_apisix_s() {
        let c = conf(serde_json::json!({}));
        assert_eq!(
            (c.batch_max_size, c.inactive_timeout, c.buffer_duration, c.max_retry_count, c.retry_delay),
            (1000, 5, 60, 0, 1)
        );
    }

    #[test]
    fn full_batches_go_at_once_and_the_rest_after_inactive_timeout() {
        run(async {
            let got = Arc::new(Mutex::new(Vec::new()));
            let sink = Recorder { got: got.clone(), fail: Arc::new(AtomicU64::new(0)), hang: false };
            let p = Processor::new(
                "t",
                &owner("a"),
                &conf(serde_json::json!({"batch_max_size": 2, "inactive_timeout": 3})),
                Limits::default(),
                sink,
                Arc::new(Here),
            );
            for i in 0..3 {
                assert!(p.push(format!("{i}")));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert_eq!(*got.lock().expect("lock"), vec![vec!["0".to_string(), "1".into()]]);
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(got.lock().expect("lock").len(), 1, "inactive_timeout not reached");
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(got.lock().expect("lock").last(), Some(&vec!["2".to_string()]));
            assert_eq!((p.stats().sent(), p.stats().pending_entries()), (3, 0));
        });
    }

    #[test]
    fn buffer_duration_bounds_the_wait_of_a_busy_trickle() {
        run(async {
            let got = Arc::new(Mutex::new(Vec::new()));
            let sink = Recorder { got: got.clone(), fail: Arc::new(AtomicU64::new(0)), hang: false };
            let c = conf(serde_json::json!({"inactive_timeout": 5, "buffer_duration": 7}));
            let p = Processor::new("t", &owner("b"), &c, Limits::default(), sink, Arc::new(Here));
            // One entry every 2 s never lets inactive_timeout pass; buffer_duration sends.
            for i in 0..5 {
                p.push(format!("{i}"));
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let got = got.lock().expect("lock").clone();
            assert_eq!(got.first().map(Vec::len), Some(4), "{got:?}");
        });
    }

    #[test]
    fn failed_batches_are_retried_then_dropped_and_counted() {
        run(async {
            let got = Arc::new(Mutex::new(Vec::new()));
            let fail = Arc::new(AtomicU64::new(2));
            let sink = Recorder { got: got.clone(), fail: fail.clone(), hang: false };
            let c = conf(serde_json::json!({"batch_max_size": 1, "max_retry_count": 1, "retry_delay": 1}));
            let p = Processor::new("t", &owner("c"), &c, Limits::default(), sink, Arc::new(Here));
            p.push("x".into());
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!((p.stats().dropped_failed(), p.stats().retries.load(Ordering::Relaxed)), (1, 1));
            p.push("y".into());
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(*got.lock().expect("lock"), vec![vec!["y".to_string()]]);
        });
    }

    #[test]
    fn a_hung_sink_holds_entries_and_bytes_to_the_bound_and_drops_the_rest() {
        run(async {
            let sink = Recorder { got: Default::default(), fail: Arc::new(AtomicU64::new(0)), hang: true };
            let c = conf(serde_json::json!({"batch_max_size": 10}));
            let p = Processor::new(
                "t",
                &owner("d"),
                &c,
                Limits { max_entries: 25, max_bytes: 1 << 20 },
                sink,
                Arc::new(Here),
            );
            let kept = (0..100).filter(|_| p.push("e".into())).count();
            tokio::time::sleep(Duration::from_secs(100)).await;
            assert_eq!(kept, 25);
            assert_eq!((p.stats().dropped_full(), p.stats().pending_entries()), (75, 25));
            let sink = Recorder { got: Default::default(), fail: Arc::new(AtomicU64::new(0)), hang: true };
            let p = Processor::new(
                "t",
                &owner("e"),
                &c,
                Limits { max_entries: 1000, max_bytes: 1000 },
                sink,
                Arc::new(Here),
            );
            let kept = (0..100).filter(|_| p.push("x".repeat(100))).count();
            assert_eq!((kept, p.stats().pending_bytes()), (10, 1000));
            // Full: the entry is not even made.
            assert!(!p.push_with(|| unreachable!("made while full")));
            assert_eq!(p.stats().dropped_full(), 91);
        });
    }

    #[test]
    fn drops_and_deliveries_are_exposed_per_plugin_and_resource() {
        let c = conf(serde_json::json!({}));
        let p = Processor::new(
            "expose-test",
            &owner("r9"),
            &c,
            Limits::default(),
            Recorder { got: Default::default(), fail: Default::default(), hang: false },
            crate::services::Services::http_client(&crate::NoServices),
        );
        assert!(!p.push("{}".into()));
        let mut e = Exposition::new("weir_");
        expose(&mut e);
        let text = e.into_text();
        assert!(
            text.contains(
                "weir_log_sink_dropped_total{plugin=\"expose-test\",resource=\"routes\",id=\"r9\",reason=\"full\"} 1"
            ),
            "{text}"
        );
    }
}
