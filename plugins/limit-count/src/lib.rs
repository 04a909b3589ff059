//! `limit-count`: at most `count` requests per `time_window` seconds per key, in a fixed or a
//! sliding window (APISIX 3.x's fields: `key_type`, `group`, `window_type`, `sync_interval`,
//! `show_limit_quota_header`, the Redis policies).
//!
//! Counters live in a store chosen by `policy`: `local` keeps them in this process, in the
//! plugin's bounded store (`local`); the Redis policies keep them in Redis, shared by every
//! instance naming the same server (`shared`), optionally counted locally between syncs
//! (`sync`). Counters belong to the plugin, not to a snapshot, so a reload that keeps a
//! route's configuration keeps its counts; a changed configuration starts new windows (as
//! APISIX keys counters by configuration version), unless the route is in a `group`.

mod coalesce;
mod conf;
mod local;
mod shared;
mod sync;

use std::sync::Arc;
use std::time::Duration;

use weir_plugin::http::{HeaderName, HeaderValue};
use weir_plugin::limit::redis::{RedisStore, RedisTarget, Registry, Shared};
use weir_plugin::limit::{self, Amount, LimitKey, MaxKeys, Rejection, DEFAULT_MAX_KEYS};
use weir_plugin::{
    register_plugin, BuildContext, Flow, InitEnv, Late, Owner, Plugin, PluginInstance, PluginResponse, RequestCtx,
    Value,
};

pub use conf::{Conf, Metadata, Policy, WindowType};

/// The result of counting one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the request is within the limit.
    pub allowed: bool,
    /// Requests left in the window.
    pub remaining: u64,
    /// Seconds until the window resets (or, refused in a sliding window, until one fits).
    pub reset: u64,
}

impl Verdict {
    const REJECT: Verdict = Verdict { allowed: false, remaining: 0, reset: 0 };
}

/// The plugin: the process-wide bounded store and the Redis targets in use.
pub struct LimitCount {
    local: Arc<local::Store>,
    redis: Registry,
}

impl Default for LimitCount {
    fn default() -> Self {
        LimitCount { local: local::Store::new("limit-count", DEFAULT_MAX_KEYS), redis: Registry::new("limit-count") }
    }
}

enum Mode {
    Local(Arc<local::Store>),
    /// Every request asks Redis; concurrent ones of a fixed window share calls ([`coalesce`]).
    Redis(Arc<RedisStore>, Arc<coalesce::Coalescer>),
    /// `sync_interval`; windows not longer than the interval go to Redis on every request.
    Synced(Arc<sync::Syncer>, Arc<RedisStore>, u64, Arc<coalesce::Coalescer>),
}

struct Instance {
    key: LimitKey,
    count: Amount,
    window: Amount,
    window_type: WindowType,
    /// The counters' namespace (part of Redis keys), and its hash (part of the local keys).
    scope: Arc<str>,
    scope_id: u64,
    mode: Mode,
    outcome: Outcome,
    degrade: bool,
}

/// What the accepted or rejected request gets (made once per configuration).
struct Outcome {
    /// The quota headers' names, unless `show_limit_quota_header` is off.
    headers: Option<[HeaderName; 3]>,
    /// `X-RateLimit-Limit`'s value when `count` is a number.
    limit_value: Option<HeaderValue>,
    rejection: Rejection,
}

impl Outcome {
    fn headers(&self, limit: u64, v: Verdict) -> Option<[(HeaderName, HeaderValue); 3]> {
        let [l, r, t] = self.headers.clone()?;
        let limit = self.limit_value.clone().unwrap_or_else(|| HeaderValue::from(limit));
        Some([(l, limit), (r, HeaderValue::from(v.remaining)), (t, HeaderValue::from(v.reset))])
    }

    fn apply(&self, ctx: &mut RequestCtx, limit: u64, v: Verdict) -> Flow<'static> {
        let headers = self.headers(limit, v);
        if v.allowed {
            ctx.response_headers.extend(headers.into_iter().flatten());
            return Flow::Continue;
        }
        let mut resp = self.rejection.response();
        for (k, v) in headers.into_iter().flatten() {
            resp.headers.append(k, v);
        }
        Flow::Respond(resp)
    }
}

fn failed(why: &str) -> PluginResponse {
    log::error!("limit-count: {why}");
    Rejection::new(500, "failed to limit count").response()
}

impl Instance {
    /// The limit and window of this request (they may be variables).
    fn limits(&self, ctx: &RequestCtx) -> Result<(u64, u64), String> {
        let count = self.count.get(ctx).map_err(|e| format!("count: {e}"))?;
        let window = self.window.get(ctx).map_err(|e| format!("time_window: {e}"))?;
        // Whole milliseconds Redis accepts as an expiry (~285,000 years).
        Ok((count, window.saturating_mul(1000).min(1 << 53)))
    }

    fn shared<'a>(
        &'a self,
        ctx: &'a mut RequestCtx,
        redis: &'a Arc<RedisStore>,
        calls: &'a Arc<coalesce::Coalescer>,
        limit: u64,
        window_ms: u64,
    ) -> Flow<'a> {
        let sliding = self.window_type == WindowType::Sliding;
        let key = self.key.with(ctx, |k| {
            if sliding {
                shared::sliding_base(&self.scope, k)
            } else {
                shared::fixed_key(&self.scope, k)
            }
        });
        Flow::wait(async move {
            let counted = if sliding {
                shared::sliding(redis, &key, limit, window_ms, limit::wall_ms()).await
            } else {
                calls.count(redis, key, window_ms).await.map(|(n, left)| shared::fixed_verdict(n, left, limit))
            };
            match counted {
                Ok(v) => self.outcome.apply(ctx, limit, v),
                Err(_) if self.degrade => Flow::Continue,
                Err(_) => Flow::Respond(limit::store_unavailable("limit-count")),
            }
        })
    }

    fn synced<'a>(
        &'a self,
        ctx: &'a mut RequestCtx,
        syncer: &'a Arc<sync::Syncer>,
        limit: u64,
        window_ms: u64,
    ) -> Flow<'a> {
        let now = limit::wall_ms();
        let (hash, key) = self.key.with(ctx, |k| (syncer.hash(self.scope_id, k), syncer.redis_key(&self.scope, k)));
        match syncer.local(hash, now) {
            sync::Local::Decided { verdict, queue } => {
                if queue {
                    syncer.queue(hash, key, limit, window_ms);
                }
                self.outcome.apply(ctx, limit, verdict)
            }
            sync::Local::Ask => Flow::wait(async move {
                match syncer.ask(hash, &key, limit, window_ms, now).await {
                    Ok(v) => self.outcome.apply(ctx, limit, v),
                    Err(_) if self.degrade => Flow::Continue,
                    Err(_) => Flow::Respond(limit::store_unavailable("limit-count")),
                }
            }),
        }
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let (limit, window_ms) = match self.limits(ctx) {
            Ok(l) => l,
            Err(_) if self.degrade => return Flow::Continue,
            Err(e) => return Flow::Respond(failed(&e)),
        };
        match &self.mode {
            Mode::Local(store) => {
                let hash = self.key.with(ctx, |k| store.hash(self.scope_id, k));
                let v = match self.window_type {
                    WindowType::Fixed => local::fixed(store, hash, limit, window_ms, limit::mono_ms()),
                    WindowType::Sliding => local::sliding(store, hash, limit, window_ms, limit::wall_ms()),
                };
                self.outcome.apply(ctx, limit, v)
            }
            Mode::Redis(redis, calls) => self.shared(ctx, redis, calls, limit, window_ms),
            Mode::Synced(syncer, redis, interval_ms, calls) => {
                if window_ms <= *interval_ms {
                    // A window (from a variable) not longer than the interval: no point in syncing.
                    self.shared(ctx, redis, calls, limit, window_ms)
                } else {
                    self.synced(ctx, syncer, limit, window_ms)
                }
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

fn header(name: &str, field: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("plugin metadata: {field}: `{name}` is not a header name"))
}

impl Plugin for LimitCount {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "limit-count"
    }
    fn priority(&self) -> i32 {
        1002
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(weir_plugin::schema_of::<Metadata>())
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
    fn checks_together(&self) -> bool {
        true
    }
    fn checks_together_with(&self, conf: &Value) -> bool {
        // `check_groups` compares configurations with a group only.
        conf.get("group").is_some()
    }
    fn check_together(&self, confs: &[(Owner<'_>, &Value)]) -> Vec<(usize, String)> {
        conf::check_groups(confs)
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let count = Amount::compile(&conf.count, "count", false)?;
        let window = Amount::compile(&conf.time_window, "time_window", false)?;
        let key = LimitKey::compile(conf.key_type, &conf.key)?;
        let shared = match conf.policy {
            Policy::Local => None,
            Policy::Redis => Some(Shared::Redis),
            Policy::RedisCluster => Some(Shared::Cluster),
            Policy::RedisSentinel => Some(Shared::Sentinel(&conf.sentinel)),
        };
        let sync = conf.sync_interval;
        if shared.is_some() && sync != -1.0 {
            if !sync.is_finite() || sync < 0.1 {
                return Err("sync_interval should not be smaller than 0.1".into());
            }
            if window.fixed().is_some_and(|w| sync >= w as f64) {
                return Err("sync_interval should be smaller than time_window".into());
            }
        }
        // A changed configuration starts new windows (APISIX keys counters by configuration
        // version); a group's members share theirs. `raw` is a sorted map: the same text
        // wherever it was parsed.
        let scope: Arc<str> = match &conf.group {
            Some(g) => Arc::from(format!("group/{g}")),
            None => {
                Arc::from(format!("{}:{:016x}", scope_name(&ctx.owner), limit::fnv1a64(ctx.raw.to_string().as_bytes())))
            }
        };
        let scope_id = limit::fnv1a64(scope.as_bytes());
        let mode = match shared {
            None => Mode::Local(self.local.clone()),
            Some(policy) => {
                let target = RedisTarget::from_conf(policy, &conf.redis)?;
                if ctx.check_only {
                    Mode::Local(self.local.clone())
                } else {
                    let redis = self.redis.get(target);
                    if sync == -1.0 {
                        Mode::Redis(redis, Default::default())
                    } else {
                        let window = match conf.window_type {
                            WindowType::Fixed => sync::Window::Fixed,
                            WindowType::Sliding => sync::Window::Sliding,
                        };
                        let interval = Duration::from_secs_f64(sync);
                        let syncer = sync::Syncer::new(redis.clone(), self.local.clone(), interval, window);
                        Mode::Synced(syncer, redis, interval.as_millis() as u64, Default::default())
                    }
                }
            }
        };
        let metadata = ctx.metadata_as::<Metadata>()?.unwrap_or_default();
        let headers = if conf.show_limit_quota_header {
            Some([
                header(&metadata.limit_header, "limit_header")?,
                header(&metadata.remaining_header, "remaining_header")?,
                header(&metadata.reset_header, "reset_header")?,
            ])
        } else {
            None
        };
        let outcome = Outcome {
            headers,
            limit_value: count.fixed().map(HeaderValue::from),
            rejection: Rejection::new(
                conf.rejected_code,
                conf.rejected_msg.as_deref().unwrap_or("rate limit exceeded"),
            ),
        };
        Ok(Arc::new(Instance {
            key,
            count,
            window,
            window_type: conf.window_type,
            scope,
            scope_id,
            mode,
            outcome,
            degrade: conf.allow_degradation,
        }))
    }
}

register_plugin!(LimitCount::default());

#[cfg(test)]
mod tests;
