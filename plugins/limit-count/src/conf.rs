//! limit-count's configuration (APISIX 3.x field names and defaults), its plugin metadata (the
//! quota headers' names), and the `group` rule: routes sharing a group configure it alike.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use weir_plugin::limit::redis::{RedisConf, SentinelConf};
use weir_plugin::limit::{KeyType, NumberOrVar};
use weir_plugin::Owner;

/// Where counters live.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// In this process, shared by its workers (bounded by `plugin_attr.limit-count.max_keys`).
    #[default]
    Local,
    /// In one Redis server (`redis_host`, `redis_port`...), shared by every instance using it.
    Redis,
    /// In a Redis Cluster (`redis_cluster_nodes`), shared by every instance using it.
    RedisCluster,
    /// In the Redis master Redis Sentinel names (`redis_sentinels`, `redis_master_name`).
    RedisSentinel,
}

/// `window_type`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WindowType {
    /// A window of `time_window` seconds from a key's first request.
    #[default]
    Fixed,
    /// The current clock-aligned window plus the previous one, weighted by how much of it is
    /// still within `time_window` seconds.
    Sliding,
}

/// Route configuration (field names as APISIX's limit-count).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Requests allowed per window: a number, or variables resolving to one per request
    /// (`"${http_x_quota ?? 100}"`).
    pub count: NumberOrVar,
    /// Window length in seconds: a number, or variables resolving to one.
    pub time_window: NumberOrVar,
    /// `fixed` (default) or `sliding`.
    #[serde(default)]
    pub window_type: WindowType,
    /// What `key` is: `var` (default), `var_combination` or `constant`.
    #[serde(default)]
    pub key_type: KeyType,
    /// What is counted: `remote_addr` (default), `consumer_name`, any variable; a combination
    /// with `key_type: var_combination`.
    #[serde(default = "default_key")]
    pub key: String,
    /// Status of rejected requests.
    #[serde(default = "default_code")]
    #[schemars(range(min = 200, max = 599))]
    pub rejected_code: u16,
    /// Message of rejected requests (`{"error_msg": ...}`).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub rejected_msg: Option<String>,
    /// Counter store.
    #[serde(default)]
    pub policy: Policy,
    /// Send `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    #[serde(default = "yes")]
    pub show_limit_quota_header: bool,
    /// When the counter store cannot be used: `false` (default) rejects with 503, `true` lets
    /// the request through uncounted.
    #[serde(default)]
    pub allow_degradation: bool,
    /// Redis policies: count locally and add to Redis every this many seconds (at least 0.1,
    /// less than `time_window`); `-1` (default): every request asks Redis.
    #[serde(default = "no_sync")]
    pub sync_interval: f64,
    /// Routes with the same group share counters (and must configure the plugin identically).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub group: Option<String>,
    /// The Redis fields (`redis_host`, `redis_port`, `redis_cluster_nodes`...).
    #[serde(flatten)]
    pub redis: RedisConf,
    /// The Redis Sentinel fields (`redis_sentinels`, `redis_master_name`...).
    #[serde(flatten)]
    pub sentinel: SentinelConf,
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
fn no_sync() -> f64 {
    -1.0
}

/// Plugin metadata: the names of the quota headers.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Default `X-RateLimit-Limit`.
    #[serde(default = "limit_header")]
    pub limit_header: String,
    /// Default `X-RateLimit-Remaining`.
    #[serde(default = "remaining_header")]
    pub remaining_header: String,
    /// Default `X-RateLimit-Reset`.
    #[serde(default = "reset_header")]
    pub reset_header: String,
}

fn limit_header() -> String {
    "X-RateLimit-Limit".into()
}
fn remaining_header() -> String {
    "X-RateLimit-Remaining".into()
}
fn reset_header() -> String {
    "X-RateLimit-Reset".into()
}

impl Default for Metadata {
    fn default() -> Self {
        Metadata { limit_header: limit_header(), remaining_header: remaining_header(), reset_header: reset_header() }
    }
}

/// A configuration with its defaults filled in, as compared between the members of a group
/// (APISIX compares them after its schema filled the defaults).
fn normalized(conf: &Value) -> Option<Value> {
    let conf = weir_plugin::meta::without_meta(conf);
    let parsed: Conf = weir_plugin::parse_conf(&conf).ok()?;
    serde_json::to_value(parsed).ok()
}

/// The `group` rule over every limit-count configuration of a document: the members of a group
/// share counters, so they must agree on everything (APISIX refuses a mismatch too).
pub fn check_groups(confs: &[(Owner<'_>, &Value)]) -> Vec<(usize, String)> {
    let mut first: Vec<(&str, usize, Value)> = Vec::new();
    let mut issues = Vec::new();
    for (i, (_, conf)) in confs.iter().enumerate() {
        let Some(group) = conf.get("group").and_then(Value::as_str) else { continue };
        let Some(this) = normalized(conf) else { continue };
        match first.iter().find(|(g, ..)| *g == group) {
            None => first.push((group, i, this)),
            Some((_, at, seen)) if *seen != this => issues.push((
                i,
                format!(
                    "group conf mismatched: group `{group}` is configured differently on {}; routes sharing a group must configure limit-count identically",
                    confs[*at].0
                ),
            )),
            Some(_) => {}
        }
    }
    issues
}
