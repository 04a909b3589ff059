//! `limit-count`: at most `count` requests per `time_window` seconds per key (fixed window).
//!
//! Counters live in a store chosen by `policy`: `local` keeps them in this process, shared by its
//! workers ([`local`]); `redis` and `redis-cluster` keep them in Redis, shared by every instance
//! that names the same server ([`shared`]). Counters are owned by the plugin, not by a snapshot,
//! so a reload that keeps a route's configuration keeps its counts.

mod local;
mod shared;

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderName, HeaderValue, StatusCode};
use weir_plugin::{
    register_plugin, BuildContext, Flow, Late, Owner, Plugin, PluginInstance, PluginResponse, RequestCtx,
};

pub use local::LocalStore;
pub use shared::{RedisStore, RedisTarget};

/// Where counters live.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// In this process, shared by its workers.
    #[default]
    Local,
    /// In one Redis server (`redis_host`, `redis_port`...), shared by every instance using it.
    Redis,
    /// In a Redis Cluster (`redis_cluster_nodes`), shared by every instance using it.
    RedisCluster,
}

/// Route configuration (field names as APISIX's limit-count).
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
    /// When the shared store cannot be reached: `false` (default) rejects with 503, `true` lets
    /// the request through (and logs the outage once).
    #[serde(default)]
    pub allow_degradation: bool,
    /// `policy: redis`: server host name or address.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub redis_host: Option<String>,
    /// `policy: redis`: server port.
    #[serde(default = "default_redis_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub redis_port: u16,
    /// `policy: redis` / `redis-cluster`: ACL user name (Redis 6+); empty = the default user.
    #[serde(default)]
    pub redis_username: Option<String>,
    /// `policy: redis` / `redis-cluster`: password (`AUTH`); empty = none.
    #[serde(default)]
    pub redis_password: Option<String>,
    /// `policy: redis`: database number.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub redis_database: u32,
    /// `policy: redis` / `redis-cluster`: connect and command timeout, milliseconds.
    #[serde(default = "default_redis_timeout")]
    #[schemars(range(min = 1))]
    pub redis_timeout: u64,
    /// `policy: redis-cluster`: seed nodes, `host:port` each.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub redis_cluster_nodes: Option<Vec<String>>,
    /// `policy: redis-cluster`: a name for the cluster (accepted for APISIX compatibility; used in
    /// log lines).
    #[serde(default)]
    pub redis_cluster_name: Option<String>,
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
fn default_redis_port() -> u16 {
    6379
}
fn default_redis_timeout() -> u64 {
    1000
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

/// The plugin: the process-wide local store and the shared stores in use, by target.
#[derive(Default)]
pub struct LimitCount {
    local: Arc<LocalStore>,
    shared: shared::Registry,
}

enum Store {
    Local(Arc<LocalStore>),
    Shared(Arc<RedisStore>),
}

struct Instance {
    conf: Conf,
    /// The counters' namespace (part of the Redis key), and its hash (the local store's key).
    scope: Arc<str>,
    scope_id: u64,
    store: Store,
    outcome: Outcome,
}

const LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// What the rejected or accepted request gets, once the store has counted it (made once per
/// configuration).
#[derive(Clone)]
struct Outcome {
    show_headers: bool,
    limit_header: HeaderValue,
    rejected: StatusCode,
    message: Arc<str>,
}

impl Outcome {
    fn headers(&self, v: Verdict) -> [(HeaderName, HeaderValue); 3] {
        [
            (LIMIT, self.limit_header.clone()),
            (REMAINING, HeaderValue::from(v.remaining)),
            (RESET, HeaderValue::from(v.reset)),
        ]
    }

    fn rejection(&self) -> PluginResponse {
        PluginResponse::json(self.rejected, &serde_json::json!({ "error_msg": &*self.message }))
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let key = match ctx.var(&self.conf.key) {
            Some(v) if !v.is_empty() => v,
            _ => std::borrow::Cow::Borrowed(&*ctx.remote_ip),
        };
        let window = Duration::from_secs(self.conf.time_window);
        match &self.store {
            Store::Local(local) => {
                let v = local.incoming(self.scope_id, &key, self.conf.count, window);
                let outcome = &self.outcome;
                if outcome.show_headers {
                    ctx.response_headers.extend(outcome.headers(v));
                }
                if v.allowed {
                    Flow::Continue
                } else {
                    Flow::Respond(outcome.rejection())
                }
            }
            Store::Shared(store) => {
                let store = store.clone();
                let key = store.key(&self.scope, &key);
                let (limit, degrade, outcome) = (self.conf.count, self.conf.allow_degradation, self.outcome.clone());
                Flow::wait(async move {
                    match store.incoming(&key, limit, window).await {
                        Ok(v) => {
                            let headers = if outcome.show_headers { outcome.headers(v).to_vec() } else { Vec::new() };
                            if v.allowed {
                                ctx.response_headers.extend(headers);
                                Flow::Continue
                            } else {
                                let mut resp = outcome.rejection();
                                for (k, v) in headers {
                                    resp.headers.append(k, v);
                                }
                                Flow::Respond(resp)
                            }
                        }
                        Err(()) if degrade => Flow::Continue,
                        Err(()) => Flow::Respond(PluginResponse::json(
                            StatusCode::SERVICE_UNAVAILABLE,
                            &serde_json::json!({
                                "error_msg": "limit-count: the rate-limit store is unavailable"
                            }),
                        )),
                    }
                })
            }
        }
    }
}

/// A name for the resource that owns this configuration that is the same on every instance and
/// survives reordering: `routes/7`.
fn scope_name(owner: &Owner<'_>) -> String {
    if owner.id.is_empty() {
        owner.label.to_owned()
    } else {
        format!("{}/{}", owner.kind, owner.id)
    }
}

/// 64-bit FNV-1a: stable across builds and hosts (the scope is part of shared Redis keys).
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

impl Plugin for LimitCount {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "limit-count"
    }
    fn priority(&self) -> i32 {
        1002
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let parsed = conf;
        // A changed configuration starts new windows (as APISIX keys counters by conf version);
        // an unchanged one keeps its counts across reloads and instances. `conf` is a sorted map,
        // so its text is the same wherever it was parsed.
        let scope: Arc<str> =
            Arc::from(format!("{}:{:016x}", scope_name(&ctx.owner), fnv1a64(ctx.raw.to_string().as_bytes())));
        let store = match parsed.policy {
            Policy::Local => Store::Local(self.local.clone()),
            Policy::Redis | Policy::RedisCluster => {
                let target = RedisTarget::from_conf(&parsed)?;
                if ctx.check_only {
                    Store::Local(self.local.clone())
                } else {
                    Store::Shared(self.shared.get(target))
                }
            }
        };
        let scope_id = fnv1a64(scope.as_bytes());
        let outcome = Outcome {
            show_headers: parsed.show_limit_quota_header,
            limit_header: HeaderValue::from(parsed.count),
            rejected: StatusCode::from_u16(parsed.rejected_code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            message: Arc::from(parsed.rejected_msg.as_deref().unwrap_or("rate limit exceeded")),
        };
        Ok(Arc::new(Instance { conf: parsed, scope, scope_id, store, outcome }))
    }
}

register_plugin!(LimitCount::default());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_names_are_stable_across_reordering() {
        let owner = |label, id| Owner { kind: "routes", id, label };
        assert_eq!(scope_name(&owner("routes[2] (id 7)", "7")), "routes/7");
        assert_eq!(scope_name(&owner("routes[0] (id 7)", "7")), "routes/7");
        assert_eq!(scope_name(&owner("routes[1]", "")), "routes[1]");
    }

    #[test]
    fn shared_policies_need_their_servers() {
        let conf = |v: serde_json::Value| -> Conf { serde_json::from_value(v).expect("conf") };
        let e = RedisTarget::from_conf(&conf(serde_json::json!({"count": 1, "time_window": 1, "policy": "redis"})))
            .err()
            .unwrap_or_default();
        assert!(e.contains("redis_host"), "{e}");
        let e = RedisTarget::from_conf(&conf(serde_json::json!({
            "count": 1, "time_window": 1, "policy": "redis-cluster"
        })))
        .err()
        .unwrap_or_default();
        assert!(e.contains("redis_cluster_nodes"), "{e}");
        let ok = RedisTarget::from_conf(&conf(serde_json::json!({
            "count": 1, "time_window": 1, "policy": "redis", "redis_host": "127.0.0.1"
        })));
        assert!(ok.is_ok());
    }
}
