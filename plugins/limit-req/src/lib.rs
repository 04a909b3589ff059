//! `limit-req`: requests per second per key with a leaky bucket (APISIX's limit-req: `rate`,
//! `burst`, `nodelay`, `key_type`, `key`, `rejected_code`, `rejected_msg`,
//! `allow_degradation`, `policy` with the Redis fields).
//!
//! Requests over `rate` and within `burst` wait in the access phase (on the worker's timer: the
//! worker serves others meanwhile) until the rate allows them, or go at once with `nodelay`;
//! beyond `burst` they are rejected. Buckets live in the plugin's bounded local store
//! (`bucket`) or in Redis (`shared`).

mod bucket;
mod shared;

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::limit::redis::{Policy, RedisConf, RedisStore, RedisTarget, Registry, Shared};
use weir_plugin::limit::{self, KeyType, LimitKey, MaxKeys, Rejection, DEFAULT_MAX_KEYS};
use weir_plugin::{
    register_plugin, BuildContext, Flow, InitEnv, Late, Owner, Plugin, PluginInstance, RequestCtx, Value,
};

use bucket::{Decision, Shape};

/// Route configuration (field names and defaults as APISIX's limit-req).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Requests per second let through without delay (> 0).
    pub rate: f64,
    /// Requests per second over `rate` that are delayed rather than rejected (>= 0).
    #[schemars(range(min = 0.0))]
    pub burst: f64,
    /// What is limited: a variable (`remote_addr`, `consumer_name`, `http_x_user`...), or a
    /// combination with `key_type: var_combination`.
    pub key: String,
    /// `var` (default), `var_combination` (or, in Weir, `constant`).
    #[serde(default)]
    pub key_type: KeyType,
    /// `local` (default), `redis` or `redis-cluster`.
    #[serde(default)]
    pub policy: Policy,
    /// Status of rejected requests.
    #[serde(default = "default_code")]
    #[schemars(range(min = 200, max = 599))]
    pub rejected_code: u16,
    /// Message of rejected requests (`{"error_msg": ...}`).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub rejected_msg: Option<String>,
    /// Let requests within `burst` through at once instead of delaying them.
    #[serde(default)]
    pub nodelay: bool,
    /// When Redis cannot be used: `false` (default) rejects with 503, `true` lets the request
    /// through.
    #[serde(default)]
    pub allow_degradation: bool,
    /// The Redis fields.
    #[serde(flatten)]
    pub redis: RedisConf,
}

fn default_code() -> u16 {
    503
}

/// The plugin: the process-wide bounded store and the Redis targets in use.
pub struct LimitReq {
    local: Arc<bucket::Store>,
    redis: Registry,
}

impl Default for LimitReq {
    fn default() -> Self {
        LimitReq { local: bucket::Store::new("limit-req", DEFAULT_MAX_KEYS), redis: Registry::new("limit-req") }
    }
}

enum Mode {
    Local(Arc<bucket::Store>),
    Redis(Arc<RedisStore>),
}

struct Instance {
    key: LimitKey,
    shape: Shape,
    nodelay: bool,
    degrade: bool,
    scope: Arc<str>,
    scope_id: u64,
    mode: Mode,
    rejection: Rejection,
}

impl Instance {
    /// Acts on a decision: through at once, through after a wait, or rejected.
    fn decided(&self, d: Decision) -> Flow<'static> {
        match d {
            Decision::Reject => Flow::Respond(self.rejection.response()),
            // APISIX waits only from a millisecond up.
            Decision::Delay(s) if s >= 0.001 && !self.nodelay => Flow::wait(async move {
                limit::sleep(Duration::from_secs_f64(s.min(86_400.0))).await;
                Flow::Continue
            }),
            Decision::Delay(_) => Flow::Continue,
        }
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        match &self.mode {
            Mode::Local(store) => {
                let hash = self.key.with(ctx, |k| store.hash(self.scope_id, k));
                self.decided(bucket::incoming(store, hash, self.shape, limit::mono_ms()))
            }
            Mode::Redis(redis) => {
                let key = self.key.with(ctx, |k| shared::redis_key(&self.scope, k));
                Flow::wait(async move {
                    match shared::incoming(redis, &key, self.shape, limit::wall_ms()).await {
                        Ok(d) => match self.decided(d) {
                            Flow::Wait(f) => f.await,
                            other => other,
                        },
                        Err(_) if self.degrade => Flow::Continue,
                        Err(_) => Flow::Respond(limit::store_unavailable("limit-req")),
                    }
                })
            }
        }
    }
}

/// `routes/7`: the owner's name, the same on every instance.
fn scope_name(owner: &Owner<'_>) -> String {
    if owner.id.is_empty() {
        owner.label.to_owned()
    } else {
        format!("{}/{}", owner.kind, owner.id)
    }
}

impl Plugin for LimitReq {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "limit-req"
    }
    fn priority(&self) -> i32 {
        1001
    }
    fn attr_schema(&self) -> Option<Value> {
        Some(MaxKeys::schema())
    }
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        let max = MaxKeys::of(attr)?;
        if !env.check_only {
            self.local.set_max_keys(max);
        }
        Ok(())
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        if !(conf.rate.is_finite() && conf.rate > 0.0) {
            return Err("rate: must be greater than 0".into());
        }
        if !(conf.burst.is_finite() && conf.burst >= 0.0) {
            return Err("burst: must be 0 or more".into());
        }
        let key = LimitKey::compile(conf.key_type, &conf.key)?;
        // A changed configuration starts with empty buckets (APISIX keys them by configuration
        // version).
        let scope: Arc<str> =
            Arc::from(format!("{}:{:016x}", scope_name(&ctx.owner), limit::fnv1a64(ctx.raw.to_string().as_bytes())));
        let scope_id = limit::fnv1a64(scope.as_bytes());
        let shared = match conf.policy {
            Policy::Local => None,
            Policy::Redis => Some(Shared::Redis),
            Policy::RedisCluster => Some(Shared::Cluster),
        };
        let mode = match shared {
            None => Mode::Local(self.local.clone()),
            Some(p) => {
                let target = RedisTarget::from_conf(p, &conf.redis)?;
                if ctx.check_only {
                    Mode::Local(self.local.clone())
                } else {
                    Mode::Redis(self.redis.get(target))
                }
            }
        };
        Ok(Arc::new(Instance {
            key,
            shape: Shape { rate: conf.rate * 1000.0, burst: conf.burst * 1000.0 },
            nodelay: conf.nodelay,
            degrade: conf.allow_degradation,
            scope,
            scope_id,
            mode,
            rejection: Rejection::new(
                conf.rejected_code,
                conf.rejected_msg.as_deref().unwrap_or("rate limit exceeded"),
            ),
        }))
    }
}

register_plugin!(LimitReq::default());

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;
    use weir_plugin::testing::{instance, run, TestRequest};

    use super::*;

    #[test]
    fn delays_within_burst() {
        let p = LimitReq::default();
        let i = instance(&p, json!({"rate": 10, "burst": 1, "key": "remote_addr", "rejected_code": 429}))
            .unwrap_or_else(|e| panic!("{e}"));
        let chain = [i];
        let started = Instant::now();
        assert!(run(&chain, &mut TestRequest::get("/").build()).is_none());
        assert!(started.elapsed() < Duration::from_millis(50), "the first goes at once");
        assert!(run(&chain, &mut TestRequest::get("/").build()).is_none());
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(80), "the second waits ~100 ms: {waited:?}");
        // A client that waits its turn stays within the rate: never rejected.
        for _ in 0..3 {
            assert!(run(&chain, &mut TestRequest::get("/").build()).is_none());
        }
    }

    #[test]
    fn nodelay_lets_the_burst_through_at_once() {
        let p = LimitReq::default();
        let i =
            instance(&p, json!({"rate": 1, "burst": 2, "key": "http_x_k", "nodelay": true, "rejected_msg": "slow"}))
                .unwrap_or_else(|e| panic!("{e}"));
        let chain = [i];
        let started = Instant::now();
        for _ in 0..3 {
            assert!(run(&chain, &mut TestRequest::get("/").header("x-k", "a").build()).is_none());
        }
        assert!(started.elapsed() < Duration::from_millis(200));
        let r = run(&chain, &mut TestRequest::get("/").header("x-k", "a").build());
        assert_eq!(
            r.map(|r| (r.status.as_u16(), r.body)),
            Some((503, weir_plugin::Bytes::from_static(b"{\"error_msg\":\"slow\"}")))
        );
    }

    #[test]
    fn apisix_refusals() {
        let p = LimitReq::default();
        for (conf, why) in [
            (json!({"rate": 0, "burst": 1, "key": "remote_addr"}), "rate"),
            (json!({"rate": 1, "burst": -1, "key": "remote_addr"}), "burst"),
            (json!({"rate": 1, "burst": 1}), "key"),
            (json!({"rate": 1, "burst": 1, "key": "remote_addr", "policy": "redis"}), "redis_host"),
            (json!({"rate": 1, "burst": 1, "key": "remote_addr", "policy": "redis-sentinel"}), "redis-sentinel"),
        ] {
            let e = instance(&p, conf.clone()).err().unwrap_or_default();
            assert!(e.contains(why), "{conf}: {e}");
        }
    }
}
