//! `tcp-logger`: request log entries sent in batches over TCP (APISIX's tcp-logger): a
//! connection per batch carrying one JSON array (one object when `batch_max_size` is 1), then
//! closed, within `timeout` milliseconds. Entries are built by `weir_plugin::log_entry` and
//! batched by `weir_plugin::batch`; the request's log phase only enqueues.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::batch::{self, BatchConf, Encode, LoggerInstance, SendFuture, Sink};
use weir_plugin::log_entry::BodyConf;
use weir_plugin::serde_json::{Map, Value};
use weir_plugin::{register_plugin, schema_of, BuildContext, InitEnv, Plugin, PluginInstance};

fn thousand() -> u64 {
    1000
}

/// Route configuration (APISIX's fields and defaults).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// The log server's address or name.
    #[schemars(length(min = 1))]
    pub host: String,
    /// Its TCP port.
    pub port: u16,
    /// TLS to the log server. Not supported yet: `true` is refused at load.
    #[serde(default)]
    pub tls: bool,
    /// APISIX's TLS options (accepted only with `tls: false`).
    #[serde(default)]
    pub tls_options: Option<String>,
    /// Milliseconds a batch may take: connect, send, close.
    #[serde(default = "thousand")]
    #[schemars(range(min = 1))]
    pub timeout: u64,
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

struct TcpSink {
    host: String,
    port: u16,
    timeout: Duration,
    batch_max_size: usize,
}

impl Sink for TcpSink {
    fn send<'a>(&'a self, entries: &'a [String]) -> SendFuture<'a> {
        Box::pin(async move {
            let payload = batch::json_array(entries, self.batch_max_size);
            batch::tcp_send(&self.host, self.port, self.timeout, payload.as_bytes()).await
        })
    }
}

struct Entry;
impl Encode for Entry {}

/// The plugin.
pub struct TcpLogger;

impl Plugin for TcpLogger {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "tcp-logger"
    }
    fn priority(&self) -> i32 {
        405
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(schema_of::<batch::SinkMetadata>())
    }
    fn init(&self, _attr: Option<&Value>, _env: &InitEnv) -> Result<(), String> {
        batch::register_metrics();
        Ok(())
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        if conf.tls {
            return Err("tls: TLS to the log server is not supported yet (use a local TLS-terminating relay)".into());
        }
        let sink = TcpSink {
            host: conf.host,
            port: conf.port,
            timeout: Duration::from_millis(conf.timeout),
            batch_max_size: conf.batch.batch_max_size as usize,
        };
        LoggerInstance::build("tcp-logger", ctx, conf.log_format.as_ref(), conf.body, &conf.batch, sink, Entry)
    }
}

register_plugin!(TcpLogger);
