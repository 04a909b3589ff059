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
use weir_plugin::template::{self, Piece, Template};
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
    /// None when only validating (nothing is opened).
    writer: Option<Arc<LineWriter>>,
    format: Vec<(String, Template)>,
}

impl PluginInstance for Instance {
    /// Its format may read request headers (`$http_*`).
    fn late(&self) -> Late {
        Late { headers: true, ..Late::LOG }
    }
    fn log(&self, ctx: &RequestCtx) {
        let mut line = Map::with_capacity(self.format.len());
        for (field, template) in &self.format {
            let value = match template.pieces() {
                // A lone variable keeps its type: absent is `null`, the status a number.
                [Piece::Var(name)] if &**name == "status" => Value::from(ctx.status),
                [Piece::Var(name)] => template::value(name, ctx).map_or(Value::Null, |v| Value::String(v.into_owned())),
                _ => Value::String(template.render(ctx).into_owned()),
            };
            line.insert(field.clone(), value);
        }
        if let Some(w) = &self.writer {
            w.line(Value::Object(line).to_string());
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
        let format = format
            .into_iter()
            .map(|(field, text)| match Template::compile(&text) {
                Ok(t) => Ok((field, t)),
                Err(e) => Err(format!("plugin metadata: log_format.{field}: {e}")),
            })
            .collect::<Result<Vec<_>, String>>()?;
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
