//! The HTTP plugin's configuration: APISIX 3.x limit-conn's fields and defaults, `rules`
//! included.

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::limit::redis::{Policy, RedisConf};
use weir_plugin::limit::{KeyType, NumberOrVar};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Requests in progress at once per key: a number, or variables resolving to one
    /// (`"${http_x_conn ?? 5}"`). Required unless `rules` is given.
    #[serde(default)]
    pub conn: Option<NumberOrVar>,
    /// Requests over `conn` that are delayed rather than rejected. Required unless `rules`.
    #[serde(default)]
    pub burst: Option<NumberOrVar>,
    /// Seconds of delay per `conn` requests over the limit (> 0).
    pub default_conn_delay: f64,
    /// Always delay by `default_conn_delay` units; otherwise the unit follows the requests'
    /// latency (the average of the unit and each finished request's latency).
    #[serde(default)]
    pub only_use_default_delay: bool,
    /// `var` (default) or `var_combination` (Weir also takes `constant`).
    #[serde(default)]
    pub key_type: KeyType,
    /// What requests are counted by (default `remote_addr`).
    #[serde(default)]
    pub key: Option<String>,
    /// Status of rejected requests.
    #[serde(default = "default_code")]
    #[schemars(range(min = 200, max = 599))]
    pub rejected_code: u16,
    /// Message of rejected requests (`{"error_msg": ...}`).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub rejected_msg: Option<String>,
    /// When the counter store cannot be used: `false` (default) rejects with 503, `true` lets
    /// the request through uncounted.
    #[serde(default)]
    pub allow_degradation: bool,
    /// `local` (default), `redis` or `redis-cluster`.
    #[serde(default)]
    pub policy: Policy,
    /// Redis policies: seconds after which a request's place expires if its gateway never gave
    /// it back (a crash).
    #[serde(default = "default_ttl")]
    #[schemars(range(min = 1))]
    pub key_ttl: u64,
    /// Several limits, applied in order (APISIX 3.16): each with its own `conn`, `burst` and
    /// `key` (a combination of variables; a rule whose variables are all absent is skipped).
    #[serde(default)]
    pub rules: Option<Vec<Rule>>,
    /// The Redis fields.
    #[serde(flatten)]
    pub redis: RedisConf,
}

/// One of `rules`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Rule {
    /// Requests at once.
    pub conn: NumberOrVar,
    /// Requests over `conn` that are delayed.
    pub burst: NumberOrVar,
    /// A combination of variables (`${http_x_tenant}`).
    pub key: String,
}

fn default_code() -> u16 {
    503
}
fn default_ttl() -> u64 {
    3600
}
