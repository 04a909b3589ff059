//! `http-logger`: request log entries POSTed in batches to an HTTP(S) server (APISIX's
//! http-logger). Entries are built by `weir_plugin::log_entry` (the full log, or `log_format`
//! from the configuration or the plugin metadata) and batched by `weir_plugin::batch`; the
//! request's log phase only enqueues. Batches go through the host's HTTP client (the worker's
//! connection pool, rustls), as one JSON array (`concat_method: json`; one object when
//! `batch_max_size` is 1) or one JSON object per line (`new_line`).

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::batch::{self, BatchConf, Encode, SendFuture, Sink, SinkPlugin};
use weir_plugin::http::header::{AUTHORIZATION, CONTENT_TYPE};
use weir_plugin::http::{HeaderValue, Method};
use weir_plugin::serde_json::{Map, Value};
use weir_plugin::{register_plugin, BuildContext, HttpClient, OutboundRequest, RequestCtx};

/// How a batch's entries are put together.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Concat {
    /// One JSON array (one object when `batch_max_size` is 1); `Content-Type: application/json`.
    #[default]
    Json,
    /// One JSON object per line; `Content-Type: text/plain`.
    NewLine,
}

fn three() -> u64 {
    3
}
fn yes() -> bool {
    true
}

/// The plugin's own fields (APISIX's names and defaults); with `log_format`, the body fields and
/// the batch processor's, they make its configuration (`weir_plugin::batch::SinkConf`).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Conf {
    /// The log server: an `http://` or `https://` URL.
    #[schemars(length(min = 1))]
    pub uri: String,
    /// Sent as the `Authorization` header.
    #[serde(default)]
    pub auth_header: Option<String>,
    /// Seconds a batch may take: connect, send, and the server's answer.
    #[serde(default = "three")]
    #[schemars(range(min = 1))]
    pub timeout: u64,
    /// Keep the connection to the log server for the next batch.
    #[serde(default = "yes")]
    pub keepalive: bool,
    /// `json` (default) or `new_line`.
    #[serde(default)]
    pub concat_method: Concat,
    /// Verify the log server's certificate (`https`). Off by default, as in APISIX.
    #[serde(default)]
    pub ssl_verify: bool,
}

/// Batches as POSTs through the host's client.
pub struct HttpSink {
    client: Arc<dyn HttpClient>,
    uri: String,
    auth: Option<HeaderValue>,
    timeout: Duration,
    keepalive: bool,
    verify: bool,
    concat: Concat,
    batch_max_size: usize,
}

impl Sink for HttpSink {
    fn send<'a>(&'a self, entries: &'a [String]) -> SendFuture<'a> {
        Box::pin(async move {
            let (body, kind) = match self.concat {
                Concat::Json => (batch::json_array(entries, self.batch_max_size), "application/json"),
                Concat::NewLine => (entries.join("\n"), "text/plain"),
            };
            let mut req = OutboundRequest::new(Method::POST, self.uri.clone());
            req.headers.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
            if let Some(a) = &self.auth {
                req.headers.insert(AUTHORIZATION, a.clone());
            }
            req.body = body.into();
            req.timeout = self.timeout;
            req.keepalive = self.keepalive;
            req.verify_tls = self.verify;
            req.max_body = 64 << 10;
            let resp = self.client.send(req).await.map_err(|e| e.to_string())?;
            if resp.status.as_u16() >= 400 {
                let text = String::from_utf8_lossy(&resp.body[..resp.body.len().min(256)]).into_owned();
                return Err(format!("{} answered {}: {text}", self.uri, resp.status));
            }
            Ok(())
        })
    }
}

/// Entries without a route say `"route_id": "no-matched"`, as APISIX's.
pub struct Entry;

impl Encode for Entry {
    fn encode(&self, _ctx: &RequestCtx, mut entry: Map<String, Value>) -> String {
        if entry.get("route_id").is_none_or(Value::is_null) {
            entry.insert("route_id".into(), Value::String("no-matched".into()));
        }
        Value::Object(entry).to_string()
    }
}

/// The plugin.
pub struct HttpLogger;

impl SinkPlugin for HttpLogger {
    type Own = Conf;
    type Sink = HttpSink;
    type Encode = Entry;
    const NAME: &'static str = "http-logger";
    const PRIORITY: i32 = 410;
    fn sink(&self, conf: Conf, batch: &BatchConf, ctx: &BuildContext<'_>) -> Result<(HttpSink, Entry), String> {
        let uri: weir_plugin::http::Uri =
            conf.uri.parse().map_err(|e| format!("uri: {:?} is not a URL: {e}", conf.uri))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none_or(str::is_empty) {
            return Err(format!("uri: {:?} is not an http:// or https:// URL with a host", conf.uri));
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(format!("uri: {:?} carries user information (use auth_header)", conf.uri));
        }
        let auth = conf
            .auth_header
            .as_deref()
            .map(HeaderValue::from_str)
            .transpose()
            .map_err(|_| "auth_header: not a valid header value (control characters?)".to_string())?;
        let sink = HttpSink {
            client: ctx.services.http_client(),
            uri: conf.uri,
            auth,
            timeout: Duration::from_secs(conf.timeout),
            keepalive: conf.keepalive,
            verify: conf.ssl_verify,
            concat: conf.concat_method,
            batch_max_size: batch.batch_max_size as usize,
        };
        Ok((sink, Entry))
    }
}

register_plugin!(HttpLogger);

#[cfg(test)]
mod tests {
    use serde_json::json;
    use weir_plugin::testing::instance_with_consumers;

    use super::*;

    #[test]
    fn malformed_configurations_are_refused_with_the_key() {
        let bad = |conf: Value, key: &str| {
            let e = instance_with_consumers(&HttpLogger, conf.clone(), &[])
                .err()
                .unwrap_or_else(|| panic!("{conf} passed"));
            assert!(e.contains(key), "{conf}: {e}");
        };
        bad(json!({"uri": "ftp://127.0.0.1/x"}), "uri");
        bad(json!({"uri": "http://u:p@127.0.0.1/x"}), "uri");
        bad(json!({"uri": "http://127.0.0.1/", "batch_max_size": 0}), "batch_max_size");
        bad(json!({"uri": "http://127.0.0.1/", "concat_method": "xml"}), "concat_method");
        bad(json!({"uri": "http://127.0.0.1/", "log_format": {"a": "$nope"}}), "log_format.a");
        bad(
            json!({"uri": "http://127.0.0.1/", "include_resp_body_expr": [["status", "=", 200]]}),
            "include_resp_body_expr",
        );
        bad(json!({"uri": "http://127.0.0.1/", "unknown": 1}), "unknown");
        assert!(instance_with_consumers(&HttpLogger, json!({"uri": "https://127.0.0.1:9/logs?x=1"}), &[]).is_ok());
    }
}
