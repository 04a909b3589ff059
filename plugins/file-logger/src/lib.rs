//! `file-logger`: one JSON line per request, appended to a file.
//!
//! The line's fields come from the plugin metadata `log_format` (field name → `$variable` or
//! literal text), with a sensible default. The request path only formats the line and puts it on
//! a bounded queue; a writer thread per file does the I/O. On graceful shutdown the queues are
//! drained before the process exits; on SIGUSR1 the files are reopened (log rotation).

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};
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

/// Lines waiting for a writer before new ones are dropped (and counted).
pub const QUEUE: usize = 65_536;

enum Msg {
    Line(String),
    Reopen,
}

struct Writer {
    tx: Mutex<Option<SyncSender<Msg>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    dropped: AtomicU64,
}

impl Writer {
    fn start(path: PathBuf) -> Result<Arc<Writer>, String> {
        let file = open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let (tx, rx) = sync_channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("file-logger".into())
            .spawn(move || write_loop(path, file, rx))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(Writer { tx: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)), dropped: AtomicU64::new(0) }))
    }

    fn send(&self, msg: Msg) {
        let guard = self.tx.lock();
        let Some(tx) = guard.as_ref() else { return };
        match tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed);
                if n.is_power_of_two() {
                    log::warn!("file-logger: writer behind, {} lines dropped so far", n + 1);
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Closes the queue and waits until every queued line is written.
    fn finish(&self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).open(path)
}

fn write_loop(path: PathBuf, file: File, rx: Receiver<Msg>) {
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    let mut failing = false;
    let report = |r: std::io::Result<()>, failing: &mut bool| match r {
        Ok(()) => *failing = false,
        Err(e) if !*failing => {
            *failing = true;
            log::error!("file-logger: writing {}: {e}", path.display());
        }
        Err(_) => {}
    };
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Line(line) => {
                    let r = out.write_all(line.as_bytes()).and_then(|_| out.write_all(b"\n"));
                    report(r, &mut failing);
                }
                Msg::Reopen => {
                    report(out.flush(), &mut failing);
                    match open(&path) {
                        Ok(f) => out = BufWriter::with_capacity(64 * 1024, f),
                        Err(e) => log::error!("file-logger: reopening {}: {e}", path.display()),
                    }
                }
            }
            next = rx.try_recv().ok();
        }
        // The queue is empty: make what was written visible.
        report(out.flush(), &mut failing);
    }
    report(out.flush(), &mut failing);
}

/// The plugin.
#[derive(Default)]
pub struct FileLogger {
    writers: Mutex<HashMap<PathBuf, Arc<Writer>>>,
}

struct Instance {
    /// None under `weir -t` (nothing is opened).
    writer: Option<Arc<Writer>>,
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
            w.send(Msg::Line(Value::Object(line).to_string()));
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
        let mut writers = self.writers.lock();
        let writer = match writers.get(&path) {
            Some(w) => w.clone(),
            None => {
                let w = Writer::start(path.clone())?;
                writers.insert(path, w.clone());
                w
            }
        };
        Ok(Arc::new(Instance { writer: Some(writer), format }))
    }
    fn reopen_logs(&self) {
        for w in self.writers.lock().values() {
            w.send(Msg::Reopen);
        }
    }
    fn shutdown(&self) {
        let writers: Vec<Arc<Writer>> = self.writers.lock().drain().map(|(_, w)| w).collect();
        for w in writers {
            w.finish();
        }
    }
}

register_plugin!(FileLogger::default());
