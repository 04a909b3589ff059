//! `file-logger`: one JSON line per request, appended to a file.
//!
//! The line's fields come from the plugin metadata `log_format` (field name → `$variable` or
//! literal text), with a sensible default. The request path only formats the line and puts it on
//! a bounded queue; a writer thread per file does the I/O. On graceful shutdown the queues are
//! drained before the process exits; on SIGUSR1 the files are reopened (log rotation).

use std::path::PathBuf;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};
use weir_plugin::log_entry::{LogFormat, MAX_BODY};
use weir_plugin::logfile::{LineWriter, LogFiles};
use weir_plugin::{register_plugin, schema_of, BuildContext, Late, Plugin, PluginInstance, RequestCtx};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// File to append to (absolute, or relative to the working directory).
    #[schemars(length(min = 1))]
    pub path: String,
}

/// Plugin metadata.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Field name → `$variable` (e.g. `$remote_addr`, `$http_user_agent`), text, or a nested
    /// object of them (the loggers' shared `log_format`, `weir_plugin::log_entry`).
    #[serde(default)]
    pub log_format: Map<String, Value>,
}

/// The default line format.
pub fn default_format() -> Vec<(String, String)> {
    [
        ("time", "$time_iso8601"),
        ("client_ip", "$remote_addr"),
        ("host", "$host"),
        ("method", "$request_method"),
        ("uri", "$request_uri"),
        ("status", "$status"),
        ("route_id", "$route_id"),
        ("consumer", "$consumer_name"),
        ("upstream_addr", "$upstream_addr"),
        ("request_time", "$request_time"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

/// The plugin.
#[derive(Default)]
pub struct FileLogger {
    files: LogFiles,
}

struct Instance {
    /// None when only validating (nothing is opened).
    writer: Option<Arc<LineWriter>>,
    format: LogFormat,
}

impl PluginInstance for Instance {
    /// Its format may read request headers (`$http_*`).
    fn late(&self) -> Late {
        Late { headers: true, ..Late::LOG }
    }
    fn log(&self, ctx: &RequestCtx) {
        if let Some(w) = &self.writer {
            let mut line = String::with_capacity(256);
            self.format.write_json(ctx, ctx.body.as_deref(), MAX_BODY, &mut line);
            w.line(line);
        }
    }
}

impl Plugin for FileLogger {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "file-logger"
    }
    fn priority(&self) -> i32 {
        399
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(schema_of::<Metadata>())
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let c = conf;
        let format = match ctx.metadata_as::<Metadata>()? {
            Some(meta) if !meta.log_format.is_empty() => {
                LogFormat::compile(&meta.log_format).map_err(|e| format!("plugin metadata: {e}"))?
            }
            _ => LogFormat::compile_pairs(&default_format())?,
        };
        let path = PathBuf::from(&c.path);
        if ctx.check_only {
            return Ok(Arc::new(Instance { writer: None, format }));
        }
        let writer = self.files.get("file-logger", path)?;
        Ok(Arc::new(Instance { writer: Some(writer), format }))
    }
    fn reopen_logs(&self) {
        self.files.reopen();
    }
    fn shutdown(&self) {
        self.files.finish();
    }
}

register_plugin!(FileLogger::default());
