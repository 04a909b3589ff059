//! `file-logger`: one JSON line per request, appended to a file.
//!
//! The line's fields come from the plugin metadata `log_format` (field name → `$variable` or
//! literal text), with a sensible default. The request path only formats the line and puts it on
//! a bounded queue; a writer thread per file does the I/O. On graceful shutdown the queues are
//! drained before the process exits; on SIGUSR1 the files are reopened (log rotation).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};
use weir_plugin::logfile::{LineWriter, LogFiles};
use weir_plugin::{register_plugin, schema_of, BuildContext, Plugin, PluginInstance, RequestCtx};

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
    /// Field name → `$variable` (e.g. `$remote_addr`, `$http_user_agent`) or literal text.
    #[serde(default)]
    pub log_format: BTreeMap<String, String>,
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
    /// None under `weir -t` (nothing is opened).
    writer: Option<Arc<LineWriter>>,
    format: Vec<(String, String)>,
}

impl PluginInstance for Instance {
    fn log(&self, ctx: &RequestCtx) {
        let mut line = Map::with_capacity(self.format.len());
        for (field, source) in &self.format {
            let value = match source.strip_prefix('$') {
                None => Value::String(source.clone()),
                Some("time_iso8601") => {
                    Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                }
                Some("status") => Value::from(ctx.status),
                Some(var) => ctx.var(var).map_or(Value::Null, |v| Value::String(v.into_owned())),
            };
            line.insert(field.clone(), value);
        }
        if let Some(w) = &self.writer {
            w.line(Value::Object(line).to_string());
        }
    }
}

impl Plugin for FileLogger {
    fn name(&self) -> &'static str {
        "file-logger"
    }
    fn priority(&self) -> i32 {
        399
    }
    fn schema(&self) -> Value {
        schema_of::<Conf>()
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(schema_of::<Metadata>())
    }
    fn build(&self, conf: &Value, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let c: Conf = weir_plugin::parse_conf(conf)?;
        let format = match ctx.metadata {
            Some(m) => {
                let meta: Metadata = weir_plugin::parse_conf(m)?;
                if meta.log_format.is_empty() {
                    default_format()
                } else {
                    meta.log_format.into_iter().collect()
                }
            }
            None => default_format(),
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
