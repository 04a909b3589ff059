//! `tcp-logger`: request log entries sent in batches over TCP (APISIX's tcp-logger): a
//! connection per batch carrying one JSON array (one object when `batch_max_size` is 1), then
//! closed, within `timeout` milliseconds. Entries are built by `weir_plugin::log_entry` and
//! batched by `weir_plugin::batch`; the request's log phase only enqueues.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::batch::{self, BatchConf, Encode, SendFuture, Sink, SinkPlugin};
use weir_plugin::{register_plugin, BuildContext};

fn thousand() -> u64 {
    1000
}

/// The plugin's own fields (APISIX's names and defaults); with `log_format`, the body fields and
/// the batch processor's, they make its configuration (`weir_plugin::batch::SinkConf`).
#[derive(Debug, Deserialize, JsonSchema)]
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
}

/// A connection per batch.
pub struct TcpSink {
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

/// Entries as their JSON.
pub struct Entry;
impl Encode for Entry {}

/// The plugin.
pub struct TcpLogger;

impl SinkPlugin for TcpLogger {
    type Own = Conf;
    type Sink = TcpSink;
    type Encode = Entry;
    const NAME: &'static str = "tcp-logger";
    const PRIORITY: i32 = 405;
    fn sink(&self, conf: Conf, batch: &BatchConf, _ctx: &BuildContext<'_>) -> Result<(TcpSink, Entry), String> {
        if conf.tls {
            return Err("tls: TLS to the log server is not supported yet (use a local TLS-terminating relay)".into());
        }
        let sink = TcpSink {
            host: conf.host,
            port: conf.port,
            timeout: Duration::from_millis(conf.timeout),
            batch_max_size: batch.batch_max_size as usize,
        };
        Ok((sink, Entry))
    }
}

register_plugin!(TcpLogger);
