//! `limit-count`: at most `count` requests per `time_window` seconds per key (fixed window).
//!
//! Counters live behind [`CounterStore`]; the `local` policy keeps them in this process, shared
//! by all workers. A shared policy (e.g. Redis) plugs in as another store. Counters are owned by
//! the plugin, not by a snapshot, so a reload that keeps a route's configuration keeps its counts.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderName, HeaderValue, StatusCode};
use weir_plugin::{
    register_plugin, schema_of, BuildContext, Flow, Plugin, PluginInstance, PluginResponse, RequestCtx, Value,
};

/// Where counters live.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    // In this process, shared by its workers.
    #[default]
    Local,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Requests allowed per window.
    #[schemars(range(min = 1))]
    pub count: u64,
    /// Window length in seconds.
    #[schemars(range(min = 1))]
    pub time_window: u64,
    /// What is counted: `remote_addr` (default), `consumer_name`, or any `$variable`.
    #[serde(default = "default_key")]
    #[schemars(length(min = 1))]
    pub key: String,
    /// Status of rejected requests.
    #[serde(default = "default_code")]
    #[schemars(range(min = 200, max = 599))]
    pub rejected_code: u16,
    /// Message of rejected requests (`{"error_msg": ...}`).
    #[serde(default)]
    pub rejected_msg: Option<String>,
    /// Counter store.
    #[serde(default)]
    pub policy: Policy,
    /// Send `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    #[serde(default = "yes")]
    pub show_limit_quota_header: bool,
}

fn default_key() -> String {
    "remote_addr".into()
}
fn default_code() -> u16 {
    503
}
fn yes() -> bool {
    true
}

/// The result of counting one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the request is within the limit.
    pub allowed: bool,
    /// Requests left in the window.
    pub remaining: u64,
    /// Seconds until the window resets.
    pub reset: u64,
}

/// A counter store.
pub trait CounterStore: Send + Sync {
    /// Counts one request of `key` in scope `scope` against `limit` per `window`.
    fn incoming(&self, scope: u64, key: &str, limit: u64, window: Duration) -> Verdict;
}

/// Counters in this process.
#[derive(Default)]
pub struct LocalStore {
    inner: Mutex<LocalInner>,
}

#[derive(Default)]
struct LocalInner {
    windows: HashMap<(u64, String), (Instant, u64)>,
    swept: Option<Instant>,
}

impl CounterStore for LocalStore {
    fn incoming(&self, scope: u64, key: &str, limit: u64, window: Duration) -> Verdict {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        // Drop expired windows now and then so that the map stays bounded by live keys.
        if inner.windows.len() > 10_000 && inner.swept.is_none_or(|t| now.duration_since(t) > window) {
            inner.windows.retain(|_, (start, _)| now.duration_since(*start) < window);
            inner.swept = Some(now);
        }
        let slot = match inner.windows.get_mut(&(scope, key.to_owned())) {
            Some(s) => s,
            None => inner.windows.entry((scope, key.to_owned())).or_insert((now, 0)),
        };
        if now.duration_since(slot.0) >= window {
            *slot = (now, 0);
        }
        let reset = window.saturating_sub(now.duration_since(slot.0)).as_secs_f64().ceil() as u64;
        if slot.1 >= limit {
            return Verdict { allowed: false, remaining: 0, reset };
        }
        slot.1 += 1;
        Verdict { allowed: true, remaining: limit - slot.1, reset }
    }
}

/// The plugin.
#[derive(Default)]
pub struct LimitCount {
    local: Arc<LocalStore>,
}

struct Instance {
    conf: Conf,
    scope: u64,
    store: Arc<dyn CounterStore>,
    limit_header: HeaderValue,
}

const LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

impl PluginInstance for Instance {
    fn access(&self, ctx: &mut RequestCtx) -> Flow {
        let key = match ctx.var(&self.conf.key) {
            Some(v) if !v.is_empty() => v.into_owned(),
            _ => ctx.remote_ip.to_string(),
        };
        let v = self.store.incoming(self.scope, &key, self.conf.count, Duration::from_secs(self.conf.time_window));
        if self.conf.show_limit_quota_header {
            ctx.response_headers.push((LIMIT, self.limit_header.clone()));
            ctx.response_headers.push((REMAINING, HeaderValue::from(v.remaining)));
            ctx.response_headers.push((RESET, HeaderValue::from(v.reset)));
        }
        if v.allowed {
            return Flow::Continue;
        }
        let status = StatusCode::from_u16(self.conf.rejected_code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let msg = self.conf.rejected_msg.as_deref().unwrap_or("rate limit exceeded");
        Flow::Respond(PluginResponse::json(status, &serde_json::json!({ "error_msg": msg })))
    }
}

impl Plugin for LimitCount {
    fn name(&self) -> &'static str {
        "limit-count"
    }
    fn priority(&self) -> i32 {
        1002
    }
    fn schema(&self) -> Value {
        schema_of::<Conf>()
    }
    fn build(&self, conf: &Value, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let parsed: Conf = weir_plugin::parse_conf(conf)?;
        let mut h = DefaultHasher::new();
        ctx.owner.split(' ').next().unwrap_or(ctx.owner).hash(&mut h);
        conf.to_string().hash(&mut h);
        let store: Arc<dyn CounterStore> = match parsed.policy {
            Policy::Local => self.local.clone(),
        };
        Ok(Arc::new(Instance { limit_header: HeaderValue::from(parsed.count), conf: parsed, scope: h.finish(), store }))
    }
}

register_plugin!(LimitCount::default());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_window_counts_and_resets() {
        let s = LocalStore::default();
        let w = Duration::from_millis(200);
        assert_eq!(s.incoming(1, "a", 2, w).remaining, 1);
        assert!(s.incoming(1, "a", 2, w).allowed);
        assert!(!s.incoming(1, "a", 2, w).allowed);
        assert!(s.incoming(1, "b", 2, w).allowed, "keys are independent");
        assert!(s.incoming(2, "a", 2, w).allowed, "scopes are independent");
        std::thread::sleep(Duration::from_millis(220));
        assert!(s.incoming(1, "a", 2, w).allowed, "a new window starts");
    }
}
