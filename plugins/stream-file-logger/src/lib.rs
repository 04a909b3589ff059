//! `stream-file-logger` (stream plugin): one JSON line per connection (or UDP session) when it
//! ends: time, protocol, client, listener, route, SNI, upstream, bytes each way, duration and
//! why it closed. Written off the worker threads (see `weir_plugin::logfile`).

use std::path::PathBuf;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use weir_plugin::logfile::{LineWriter, LogFiles};
use weir_plugin::{register_stream_plugin, schema_of, InitEnv, StreamCtx, StreamInstance, StreamPlugin};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// File to append to (absolute, or relative to the working directory).
    #[schemars(length(min = 1))]
    pub path: String,
}

/// The plugin.
#[derive(Default)]
pub struct StreamFileLogger {
    files: LogFiles,
    check_only: std::sync::atomic::AtomicBool,
}

struct Instance {
    /// None under `weir -t` (nothing is opened).
    writer: Option<Arc<LineWriter>>,
}

impl StreamInstance for Instance {
    fn log(&self, ctx: &StreamCtx) {
        let Some(w) = &self.writer else { return };
        let line = json!({
            "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "protocol": ctx.protocol,
            "client": ctx.remote_addr.to_string(),
            "server": ctx.local_addr.to_string(),
            "route_id": ctx.route_id.as_deref(),
            "sni": ctx.sni,
            "upstream": ctx.upstream_addr.map(|a| a.to_string()),
            "bytes_from_client": ctx.bytes_from_client,
            "bytes_to_client": ctx.bytes_to_client,
            "duration_ms": ctx.started.elapsed().as_millis() as u64,
            "close_reason": ctx.close_reason,
        });
        w.line(line.to_string());
    }
}

impl StreamPlugin for StreamFileLogger {
    fn name(&self) -> &'static str {
        "stream-file-logger"
    }
    fn priority(&self) -> i32 {
        399
    }
    fn schema(&self) -> Value {
        schema_of::<Conf>()
    }
    fn init(&self, env: &InitEnv) -> Result<(), String> {
        self.check_only.store(env.check_only, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn build(&self, conf: &Value) -> Result<Arc<dyn StreamInstance>, String> {
        let c: Conf = weir_plugin::parse_conf(conf)?;
        if self.check_only.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(Arc::new(Instance { writer: None }));
        }
        let writer = self.files.get("stream-file-logger", PathBuf::from(c.path))?;
        Ok(Arc::new(Instance { writer: Some(writer) }))
    }
    fn reopen_logs(&self) {
        self.files.reopen();
    }
    fn shutdown(&self) {
        self.files.finish();
    }
}

register_stream_plugin!(StreamFileLogger::default());
